"""A data dir left readable by an earlier start is made its owner's alone, and the object store's security file
holds what every inner server needs to refuse callers without the stack's certificate."""

import os
import stat
import tomllib
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from infra.private import make_private
from infra.seaweed_security import GRPC_ROLES, JWT_SECTIONS, write_security


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_an_existing_world_readable_data_dir_becomes_0700_folders_and_0600_files(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "logs").mkdir(parents=True)
    (data / "s3" / "m1").mkdir(parents=True)
    for name in ("ledger.sqlite", "ledger.sqlite-wal", "logs/gateway.log", "logs/gateway.pid", "s3/m1/1.dat"):
        (data / name).write_text("x")
        (data / name).chmod(0o644)
    for folder in (data, data / "logs", data / "s3", data / "s3" / "m1"):
        folder.chmod(0o755)
    (data / "elsewhere").symlink_to(tmp_path)
    tmp_path.chmod(0o755)
    make_private(data)
    for root, _dirs, files in os.walk(data):
        assert mode(Path(root)) == 0o700
        for name in files:
            if not (Path(root) / name).is_symlink():
                assert mode(Path(root) / name) == 0o600, name
    assert mode(tmp_path) == 0o755, "a link out of the data dir is not followed"


def test_the_security_file_gives_every_grpc_server_the_one_certificate_and_every_http_side_a_jwt_key(
        tmp_path: Path) -> None:
    path = write_security(tmp_path)
    config = tomllib.loads(path.read_text())
    assert mode(path) == 0o600
    ca = x509.load_pem_x509_certificate(Path(config["grpc"]["ca"]).read_bytes())
    for role in (*GRPC_ROLES, "client"):
        section = config["grpc"][role]
        cert = x509.load_pem_x509_certificate(Path(section["cert"]).read_bytes())
        cert.verify_directly_issued_by(ca)
        assert mode(Path(section["key"])) == 0o600
    keys = set()
    for dotted in JWT_SECTIONS:
        section = config
        for part in dotted.split("."):
            section = section[part]
        assert len(section["key"]) >= 32
        keys.add(section["key"])
    assert len(keys) == len(JWT_SECTIONS), "each JWT has its own key"
    assert not list(tmp_path.rglob("*ca.key")), "the CA's key is never written: nobody can sign another certificate"


def test_each_start_makes_a_new_certificate_and_new_keys(tmp_path: Path) -> None:
    first = write_security(tmp_path).read_text()
    first_cert = (tmp_path / "tls" / "store.crt").read_bytes()
    second = write_security(tmp_path).read_text()
    assert first != second and first_cert != (tmp_path / "tls" / "store.crt").read_bytes()
    key = x509.load_pem_x509_certificate((tmp_path / "tls" / "store.crt").read_bytes()).public_key()
    assert isinstance(key, ec.EllipticCurvePublicKey)
