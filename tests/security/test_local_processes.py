"""Another local user, on the machine where `sheshnag up` runs, reaches nothing but the API (with a key), NATS (with
credentials) and S3 (with credentials): not the object store's inner servers, not the data dir, not a secret."""

import contextlib
import io
import json
import os
import stat
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest
from minio import Minio
from minio.error import S3Error

from infra.embedded import seaweed_leftovers
from tests.e2e.conftest import RunningStack
from tests.security.local import (
    PROCESSES,
    StackSecrets,
    grpc_in_clear,
    grpc_over_tls,
    is_settings_frame,
    listening,
    stack_pids,
    unix_sockets,
    weed_ports,
    weed_shell,
)

WEED_GRPC = ("master.port.grpc", "volume.port.grpc", "filer.port.grpc", "s3.port.grpc", "admin.port.grpc")
WEED_HTTP = ("master.port", "volume.port", "filer.port", "admin.port")


@pytest.fixture(scope="module")
def stored_file(secure_stack: RunningStack) -> str:
    """A file in the store, so each attack has an object to reach for."""
    line = json.dumps({"custom_id": "secret-line", "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}})
    return secure_stack.client().files.create(file=("victim.jsonl", io.BytesIO(f"{line}\n".encode())),
                                              purpose="batch").id


def http_status(url: str, method: str = "GET", data: bytes | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, method=method), timeout=5) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as error:
        return error.code


def test_the_stack_listens_on_loopback_only_and_on_no_port_but_those_the_readme_lists(
        secure_stack: RunningStack) -> None:
    weed = weed_ports(secure_stack)
    known = {secure_stack.port, secure_stack.nats_port, secure_stack.s3_port,
             *(weed[flag] for flag in (*WEED_GRPC, *WEED_HTTP))}
    pids = stack_pids(secure_stack)
    for name, pid in pids.items():
        for address, port in listening(pid):
            assert address == "127.0.0.1", f"{name} listens on {address}:{port}"
            # The executor's own ports are llama.cpp's in-process servers, one per loaded model (a model other tests
            # use may load while this reads): on loopback, and serving no one (the test below).
            assert port in known or name == "executor", f"{name} listens on {port}, which no one documented"
    assert weed["s3.port.iceberg"] == 0 and weed["s3.port.lance"] == 0


@pytest.mark.parametrize("flag", WEED_GRPC)
def test_an_inner_grpc_server_refuses_a_caller_without_the_stacks_certificate(
        secure_stack: RunningStack, flag: str) -> None:
    port = weed_ports(secure_stack)[flag]
    assert not is_settings_frame(grpc_over_tls(port, None)), f"{flag} took a TLS client without a certificate"
    assert not is_settings_frame(grpc_in_clear(port)), f"{flag} speaks gRPC in clear"
    tls = secure_stack.data_dir / "s3" / "tls"
    assert is_settings_frame(grpc_over_tls(port, (tls / "store.crt", tls / "store.key"))), \
        "the store's own certificate must be let in (else this test proves nothing)"


def test_the_filer_lists_and_reads_nothing_for_a_local_user_running_weed_shell(
        secure_stack: RunningStack, stored_file: str, tmp_path: Path) -> None:
    owner = weed_shell(secure_stack, "fs.tree /buckets/sheshnag", secure_stack.data_dir / "s3", within_s=30)
    assert stored_file in owner, f"the owner's certificate lists the file (else this test proves nothing): {owner}"
    attacker = weed_shell(secure_stack, "fs.tree /buckets/sheshnag", tmp_path)
    assert stored_file not in attacker and "files" not in attacker


def test_the_master_and_filer_http_apis_are_off(secure_stack: RunningStack, stored_file: str) -> None:
    ports = weed_ports(secure_stack)
    master, filer = (f"http://127.0.0.1:{ports[flag]}" for flag in ("master.port", "filer.port"))
    for path in ("/dir/assign", "/dir/lookup?volumeId=1", "/vol/status", "/dir/status", "/col/delete?collection=x",
                 "/vol/grow", "/submit"):
        assert http_status(master + path) == 404, path
    for method, data in (("GET", None), ("POST", b"overwritten"), ("PUT", b"overwritten"), ("DELETE", None)):
        assert http_status(f"{filer}/buckets/sheshnag/", method, data) == 404, method
        assert http_status(f"{filer}/buckets/sheshnag/{stored_file}", method, data) == 404, method


def test_the_volume_server_reads_writes_and_deletes_nothing_without_a_jwt(secure_stack: RunningStack) -> None:
    volume = f"http://127.0.0.1:{weed_ports(secure_stack)['volume.port']}"
    for fid in ("1,01637037d6", "2,01637037d6", "3,0100000000"):
        assert http_status(f"{volume}/{fid}") == 401
        assert http_status(f"{volume}/{fid}", "POST", b"written") == 401
        assert http_status(f"{volume}/{fid}", "DELETE") == 401
    assert http_status(f"{volume}/ui/index.html") != 200


def test_s3_refuses_anonymous_and_wrongly_signed_requests(secure_stack: RunningStack, stored_file: str) -> None:
    secrets = StackSecrets.of(secure_stack)
    assert http_status(f"http://{secure_stack.s3_endpoint}/sheshnag/") == 403
    assert http_status(f"http://{secure_stack.s3_endpoint}/sheshnag/x", "PUT", b"x") == 403
    for access, secret in ((secrets.s3_access_key, "wrong"), ("AKNOBODY", secrets.s3_secret_key)):
        store = Minio(secure_stack.s3_endpoint, access_key=access, secret_key=secret, secure=False)
        with pytest.raises(S3Error):
            list(store.list_objects("sheshnag", recursive=True))
    right = Minio(secure_stack.s3_endpoint, access_key=secrets.s3_access_key, secret_key=secrets.s3_secret_key,
                  secure=False)
    assert any(stored_file in item.object_name for item in right.list_objects("sheshnag", recursive=True))


def test_the_executors_engine_port_serves_no_one(secure_stack: RunningStack) -> None:
    for _, port in listening(stack_pids(secure_stack)["executor"]):
        body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).encode()
        assert http_status(f"http://127.0.0.1:{port}/v1/chat/completions", "POST", body) == 401
        assert http_status(f"http://127.0.0.1:{port}/slots") in (401, 404)


def loose_files(data_dir: Path) -> list[str]:
    loose = []
    for root, _dirs, files in os.walk(data_dir):
        assert stat.S_IMODE(os.lstat(root).st_mode) == 0o700, root
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                status = os.lstat(Path(root) / name)
                if stat.S_ISREG(status.st_mode) and stat.S_IMODE(status.st_mode) != 0o600:
                    loose.append(str(Path(root, name).relative_to(data_dir)))
    return loose


def test_every_folder_of_the_data_dir_is_0700_and_every_file_0600(
        secure_stack: RunningStack, stored_file: str) -> None:
    # SeaweedFS writes its volume info files (*.vif) 0644 whatever the umask; the supervisor tightens each within a
    # tick of its making (they sit in 0700 folders meanwhile, so no one else could open them).
    deadline = time.monotonic() + 10
    while (loose := loose_files(secure_stack.data_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert loose == []
    for name in ("ledger.sqlite", "logs/gateway.log", "logs/gateway.pid", "s3/security.toml", "worker-key"):
        assert (secure_stack.data_dir / name).exists(), name


def test_the_object_store_keeps_its_logs_and_local_sockets_in_the_data_dir(secure_stack: RunningStack) -> None:
    pid = stack_pids(secure_stack)["s3"]
    started = psutil.Process(pid).create_time()
    logs = [path for path in Path(tempfile.gettempdir()).glob(f"weed.*.{pid}")]
    # A file of an earlier process that had the same pid (pids wrap) is not this store's.
    assert [path.name for path in logs if path.lstat().st_mtime >= started - 1] == []
    elsewhere = {path for path in unix_sockets(pid) if secure_stack.data_dir not in path.parents}
    # Only the gRPC sockets SeaweedFS names itself are in /tmp (no flag moves them); each is removed at its stop.
    assert elsewhere <= set(seaweed_leftovers(psutil.Process(pid).cmdline())), elsewhere
    assert any(secure_stack.data_dir in path.parents for path in unix_sockets(pid))


def test_the_stores_local_sockets_take_connections_from_its_owner_only(secure_stack: RunningStack) -> None:
    sockets = unix_sockets(stack_pids(secure_stack)["s3"])
    assert sockets
    for path in sockets:
        # Connecting to a unix socket needs write permission on it.
        assert stat.S_IMODE(path.stat().st_mode) & 0o022 == 0, path


@pytest.mark.parametrize("process", PROCESSES)
def test_a_process_holds_only_the_secrets_its_job_needs_and_none_on_its_command_line(
        secure_stack: RunningStack, process: str) -> None:
    needs = {"nats": set(), "s3": set(), "ledger": {"core NATS password"},
             "validator": {"core NATS password", "S3 secret key"},
             "scheduler": {"core NATS password", "S3 secret key", "callout seed"},
             "executor": {"worker key"}, "gateway": {"core NATS password", "S3 secret key"}}[process]
    pid = stack_pids(secure_stack)[process]
    environment = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    command_line = " ".join(psutil.Process(pid).cmdline())
    secrets = StackSecrets.of(secure_stack).named()
    assert {name for name, value in secrets.items() if value in environment} == needs
    assert {name for name, value in secrets.items() if value in command_line} == set()
    assert stat.S_IMODE(os.stat(f"/proc/{pid}/environ").st_mode) & 0o077 == 0
