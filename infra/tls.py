"""The stack's own certificate authority and its server certificate, generated into the data dir.

`sheshnag up --listen ADDR` serves broker, gateway and S3 over TLS with one certificate: a CA (kept, 0600 key) signs
a server certificate whose subject alternative names are the address clients use (an IP or a DNS name) and loopback.
The CA's certificate is public: the gateway hands it out (`GET /v1/provider/connection`), executors verify the
broker against it. A certificate is made again when it lacks a name asked for or is near its end.
"""

import hashlib
import ipaddress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from infra.private import write_private

TLS_DIR = "tls"
CA_CERT, CA_KEY, SERVER_CERT, SERVER_KEY = "ca.pem", "ca-key.pem", "server.pem", "server-key.pem"
CA_DAYS = 10 * 365
SERVER_DAYS = 398
RENEW_BEFORE = timedelta(days=30)
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class ServerTls:
    """Where the files are; the broker reads `cert` and `key`, executors verify against `ca`."""

    ca: Path
    cert: Path
    key: Path

    def ca_pem(self) -> str:
        return self.ca.read_text()


def fingerprint(pem: str) -> str:
    """SHA-256 of the certificate's DER bytes, hex: what an operator compares on the provider host."""
    der = x509.load_pem_x509_certificate(pem.encode()).public_bytes(serialization.Encoding.DER)
    return hashlib.sha256(der).hexdigest()


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Sheshnag"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _load_or_create_ca(folder: Path, now: datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert_path, key_path = folder / CA_CERT, folder / CA_KEY
    if cert_path.exists() and key_path.exists():
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        if isinstance(key, ec.EllipticCurvePrivateKey) and cert.not_valid_after_utc - RENEW_BEFORE > now:
            return cert, key
    key = _new_key()
    name = _name("Sheshnag deployment CA")
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    write_private(key_path, key_pem(key))
    write_private(cert_path, _cert_pem(cert))
    return cert, key


def _server_fits(path: Path, ca: x509.Certificate, names: list[str], now: datetime) -> bool:
    if not path.exists():
        return False
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    if cert.issuer != ca.subject or cert.not_valid_after_utc - RENEW_BEFORE <= now:
        return False
    try:
        present = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    return all(_general_name(name) in present for name in names)


def ensure_server_tls(data_dir: Path, names: list[str], now: datetime | None = None) -> ServerTls:
    """The CA (made once per data dir) and a server certificate valid for every name in `names` and loopback."""
    now = now or datetime.now(UTC)
    folder = data_dir / TLS_DIR
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca, ca_key = _load_or_create_ca(folder, now)
    wanted = list(dict.fromkeys([*names, *LOOPBACK_NAMES]))
    tls = ServerTls(folder / CA_CERT, folder / SERVER_CERT, folder / SERVER_KEY)
    if _server_fits(tls.cert, ca, wanted, now) and tls.key.exists():
        return tls
    return _issue(tls, ca, ca_key, wanted, now)


def rotate_server_tls(data_dir: Path, names: list[str], now: datetime | None = None) -> ServerTls:
    """A new server key and certificate from the data dir's CA, valid for the names the current one holds and
    `names`; each file is replaced whole (a reader sees the old pair or the new one)."""
    now = now or datetime.now(UTC)
    folder = data_dir / TLS_DIR
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca, ca_key = _load_or_create_ca(folder, now)
    tls = ServerTls(folder / CA_CERT, folder / SERVER_CERT, folder / SERVER_KEY)
    wanted = list(dict.fromkeys([*names, *server_names(tls.cert), *LOOPBACK_NAMES]))
    return _issue(tls, ca, ca_key, wanted, now)


def server_names(path: Path) -> list[str]:
    """The subject alternative names of the certificate at `path`, loopback last; none if there is none."""
    if not path.exists():
        return []
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    try:
        present = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    names = [str(name.value) for name in present if isinstance(name, x509.IPAddress | x509.DNSName)]
    return sorted(names, key=lambda name: name in LOOPBACK_NAMES)


def _issue(tls: ServerTls, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, wanted: list[str],
           now: datetime) -> ServerTls:
    key = _new_key()
    cert = (x509.CertificateBuilder().subject_name(_name(wanted[0])).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(days=SERVER_DAYS))
            .add_extension(x509.SubjectAlternativeName([_general_name(name) for name in wanted]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            # clientAuth too: a cluster's nodes present it to each other on their TLS routes.
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    # Each swapped in whole; a server that reloads between the two fails to pair them and keeps its old pair.
    write_private(tls.key, key_pem(key))
    write_private(tls.cert, _cert_pem(cert))
    return tls
