"""The embedded object store's `security.toml`: JWT keys for its inner HTTP servers and a private CA whose one
certificate every inner gRPC server demands of its callers (mTLS), so only S3 with credentials is open.

Everything here is written at each start into the store's working directory (SeaweedFS reads
`./security.toml` first), 0600, and never put on a command line or in an environment.
"""

import datetime
import ipaddress
import secrets
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from infra.private import write_private_together
from infra.tls import key_pem

SECURITY_FILE = "security.toml"
TLS_DIR = "tls"
GRPC_ROLES = ("master", "volume", "filer", "s3", "admin", "worker", "msg_broker", "msg_agent", "mq")
"""Every gRPC server SeaweedFS has a `[grpc.<role>]` section for: each demands the stack's certificate."""
JWT_SECTIONS = ("jwt.signing", "jwt.signing.read", "jwt.filer_signing", "jwt.filer_signing.read")
"""Volume writes and reads need a JWT the master signs; the filer's HTTP side, one the S3 server signs."""
CERT_DAYS = 3650
"""Long: the CA is the stack's own and is remade at each start, so nothing ever needs to renew it."""


def _certificate(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name,
                 issuer_key: ec.EllipticCurvePrivateKey, ca: bool) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
               .issuer_name(issuer).public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
        # One certificate serves both ends of every call: servers present it and clients dial with it.
        builder = (builder
                   .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                               x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                                  critical=False)
                   .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH,
                                                         x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
    return builder.sign(issuer_key, hashes.SHA256())


def tls_files(directory: Path) -> dict[Path, bytes]:
    """A fresh CA (its key is never written: nobody can sign another certificate) and the one certificate it
    signs: the CA certificate, the certificate and its key, by the paths they go to."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sheshnag object store CA")])
    ca_cert = _certificate("sheshnag object store CA", ca_key, ca_name, ca_key, ca=True)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _certificate("sheshnag-object-store", key, ca_name, ca_key, ca=False)
    return {directory / "ca.crt": ca_cert.public_bytes(serialization.Encoding.PEM),
            directory / "store.crt": cert.public_bytes(serialization.Encoding.PEM),
            directory / "store.key": key_pem(key)}


def security_toml(ca: Path, cert: Path, key: Path, jwt_keys: dict[str, str]) -> str:
    lines = ["# Written by sheshnag at each start; edits are lost.",
             # The volume server's status UI would show volumes and paths to anyone; the filer's directory
             # listing likewise (its HTTP side is off anyway, -disableHttp).
             "[access]", "ui = false", "[filer.expose_directory_metadata]", "enabled = false",
             "[grpc]", f'ca = "{ca}"']
    for section in JWT_SECTIONS:
        lines += [f"[{section}]", f'key = "{jwt_keys[section]}"', "expires_after_seconds = 10"]
    for role in GRPC_ROLES:
        lines += [f"[grpc.{role}]", f'cert = "{cert}"', f'key = "{key}"']
    lines += ["[grpc.client]", f'cert = "{cert}"', f'key = "{key}"']
    return "\n".join(lines) + "\n"


def write_security(workdir: Path) -> Path:
    """Keys and certificates are remade at each start: JWTs live 10 s and the certificate is only ever shown
    to the store itself, so nothing outlives the process that needs it. All are written or none."""
    (workdir / TLS_DIR).mkdir(mode=0o700, exist_ok=True)
    tls = tls_files(workdir / TLS_DIR)
    ca, cert, key = tls
    path = workdir / SECURITY_FILE
    toml = security_toml(ca, cert, key, {s: secrets.token_urlsafe(32) for s in JWT_SECTIONS}).encode()
    write_private_together({**tls, path: toml})
    return path
