"""The stack's own CA and the broker's certificate (`infra/tls.py`): made once per data dir, valid for the address
provider hosts reach and for loopback, made again only when a name is missing."""

import hashlib
import ssl
import stat
from pathlib import Path

from cryptography import x509

from infra.tls import ensure_server_tls, fingerprint


def names_of(path: Path) -> set[str]:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(name.value) for name in sans}


def test_the_server_certificate_names_the_listen_address_and_loopback_and_is_signed_by_the_ca(
        tmp_path: Path) -> None:
    tls = ensure_server_tls(tmp_path, ["10.1.2.3", "gpu-gateway.example"])
    assert {"10.1.2.3", "gpu-gateway.example", "127.0.0.1", "localhost", "::1"} <= names_of(tls.cert)
    ca = x509.load_pem_x509_certificate(tls.ca.read_bytes())
    x509.load_pem_x509_certificate(tls.cert.read_bytes()).verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_a_tls_client_trusting_only_the_ca_accepts_the_server_certificate(tmp_path: Path) -> None:
    tls = ensure_server_tls(tmp_path, ["10.1.2.3"])
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tls.cert, tls.key)
    client = ssl.create_default_context(cafile=str(tls.ca))
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    c = client.wrap_bio(to_client, to_server, server_hostname="10.1.2.3")
    s = server.wrap_bio(to_server, to_client, server_side=True)
    for _ in range(10):  # drive the handshake between the two in memory
        for end in (c, s):
            try:
                end.do_handshake()
            except ssl.SSLWantReadError:
                pass
    assert c.version() is not None and s.version() is not None


def test_private_keys_are_the_owners_alone(tmp_path: Path) -> None:
    ensure_server_tls(tmp_path, ["10.1.2.3"])
    for name in ("ca-key.pem", "server-key.pem"):
        assert stat.S_IMODE((tmp_path / "tls" / name).stat().st_mode) == 0o600


def test_a_second_start_keeps_both_and_a_new_address_gets_a_new_certificate_from_the_same_ca(
        tmp_path: Path) -> None:
    first = ensure_server_tls(tmp_path, ["10.1.2.3"])
    ca_pem, cert_pem = first.ca_pem(), first.cert.read_text()
    again = ensure_server_tls(tmp_path, ["10.1.2.3"])
    assert (again.ca_pem(), again.cert.read_text()) == (ca_pem, cert_pem)
    moved = ensure_server_tls(tmp_path, ["10.9.9.9"])
    assert moved.ca_pem() == ca_pem and moved.cert.read_text() != cert_pem
    assert "10.9.9.9" in names_of(moved.cert)


def test_the_fingerprint_is_the_sha256_of_the_certificate(tmp_path: Path) -> None:
    pem = ensure_server_tls(tmp_path, ["10.1.2.3"]).ca_pem()
    assert fingerprint(pem) == hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem)).hexdigest()
