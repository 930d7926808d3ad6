"""A full disk, on a filesystem of the stack's own (a tmpfs): new uploads and batches are refused with 507
`insufficient_storage` once free space is under the reserve, while reads and cancels go on and the running batch
keeps running; filled to the last byte, every answer is still clear (507/503, never a 500); once space returns the
stack serves again by itself (its broker restarted by `up`, its object store too if it goes on refusing writes),
and every line of every accepted batch is in its
output or error file exactly once. The time to recover is printed and written to `disk-full-recovery.json`.

Skipped where the machine cannot mount a tmpfs (not root, or a container without the right)."""

import contextlib
import json
import os
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from infra.embedded import free_port
from tests.e2e.conftest import ADMIN_KEY, RunningStack, last_lines, start_stack, stop_stack
from tests.factories import chat_line, jsonl, lost_and_duplicated

DISK_MIB = 128
"""Reserve on it: 32 MiB (the floor); warning under 64 MiB."""
RECOVERY_LIMIT_S = 60.0
LINES = 200
HEADERS = {"Authorization": f"Bearer {ADMIN_KEY}"}
RESULTS_ENV = "SHESHNAG_DISK_FULL_RESULTS"
"""Where the record (phases' answers, time to recover) is written besides the test's output; default: its tmp dir."""


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    disk = tmp_path / "disk"
    disk.mkdir()
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MIB}m", "tmpfs", str(disk)],
                                 capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as error:
        pytest.skip(f"cannot mount a tmpfs here ({error!r}): the disk-full test needs a filesystem of its own")
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip() or mounted.returncode}): the disk-full "
                    "test needs a filesystem of its own (root, or CAP_SYS_ADMIN)")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True, timeout=30)


def free_bytes(path: Path) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def fill(filler: Path, leave_bytes: int) -> None:
    """Grow `filler` until the disk has about `leave_bytes` free (0: until a write fails for space)."""
    chunk = b"\0" * (1 << 20)
    with filler.open("ab") as out:
        while True:
            free = free_bytes(filler.parent)
            if free <= leave_bytes:
                return
            try:
                out.write(chunk[: max(min(len(chunk), free - leave_bytes), 4096)])
                out.flush()
            except OSError:
                return


class Client:
    """Every answer the test got, by phase, with the slowest of each."""

    def __init__(self, stack: RunningStack) -> None:
        self.stack = stack
        self.http = httpx2.Client(base_url=f"http://127.0.0.1:{stack.port}", headers=HEADERS, timeout=30)
        self.seen: dict[str, Counter[str]] = {}
        self.slowest: dict[str, float] = {}
        self.phase = "before"

    def call(self, method: str, path: str, **kwargs: object) -> httpx2.Response:
        started = time.monotonic()
        response = self.http.request(method, path, **kwargs)  # type: ignore[arg-type]
        took = time.monotonic() - started
        code = ""
        if response.status_code >= 400:
            error = response.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}, error
            code = f" {error['code']}"
        self.seen.setdefault(self.phase, Counter())[f"{method} {path.split('/')[2]} {response.status_code}{code}"] += 1
        self.slowest[self.phase] = max(self.slowest.get(self.phase, 0.0), took)
        return response

    def upload(self, lines: bytes, name: str) -> httpx2.Response:
        return self.call("POST", "/v1/files", files={"file": (name, lines, "application/octet-stream")},
                         data={"purpose": "batch"})

    def create(self, file_id: str) -> httpx2.Response:
        return self.call("POST", "/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/chat/completions",
                                                      "completion_window": "24h"})

    def batch(self, batch_id: str) -> dict[str, object]:
        response = self.call("GET", f"/v1/batches/{batch_id}")
        assert response.status_code == 200, response.text
        return dict(response.json())

    def submit(self, tag: str, count: int) -> tuple[str, list[str], str]:
        ids = [f"{tag}-{i}" for i in range(count)]
        lines = jsonl(chat_line(custom_id, f"Say {i}.", max_tokens=4) for i, custom_id in enumerate(ids))
        uploaded = self.upload(lines.getvalue(), f"{tag}.jsonl")
        assert uploaded.status_code == 200, uploaded.text
        created = self.create(uploaded.json()["id"])
        assert created.status_code == 200, created.text
        return created.json()["id"], ids, uploaded.json()["id"]

    def wait_ended(self, batch_id: str, timeout_s: float) -> dict[str, object]:
        """The batch once ended; it fails only after `timeout_s` in which the batch made no progress (a loaded machine
        runs the engine slower, and a batch that still moves is not stuck)."""
        deadline, progress = time.monotonic() + timeout_s, None
        while time.monotonic() < deadline:
            batch = self.batch(batch_id)
            if batch["status"] in ("completed", "failed", "cancelled", "expired"):
                return batch
            if (batch["status"], batch["request_counts"]) != progress:
                deadline, progress = time.monotonic() + timeout_s, (batch["status"], batch["request_counts"])
            time.sleep(0.5)
        # The stack's logs are on the tmpfs, gone once the test ends: what the scheduler and executor said goes along.
        said = {name: "\n".join(self.stack.log(name).splitlines()[-40:]) for name in ("scheduler", "executor", "s3")}
        said["sheshnag up"] = last_lines(str(self.stack.data_dir.parent / f"up-{self.stack.port}.out"))
        raise AssertionError(f"batch {batch_id} made no progress in {timeout_s}s: {self.batch(batch_id)}\n"
                             + "\n".join(f"--- {name}.log ends:\n{tail}" for name, tail in said.items()))

    def lines_of(self, batch: dict[str, object]) -> Counter[str]:
        seen: Counter[str] = Counter()
        for key in ("output_file_id", "error_file_id"):
            if batch.get(key):
                content = self.call("GET", f"/v1/files/{batch[key]}/content")
                assert content.status_code == 200, content.text
                seen.update(json.loads(line)["custom_id"] for line in content.text.splitlines() if line)
        return seen


def refused_for_storage(response: httpx2.Response) -> bool:
    if response.status_code != 507:
        return False
    assert response.json()["error"]["code"] == "insufficient_storage"
    assert "Retry-After" in response.headers
    return True


@pytest.mark.timeout(420)  # a loaded machine runs the 200 lines at a quarter of the speed; each wait is on progress
def test_a_full_disk_is_refused_early_and_clearly_and_the_stack_recovers_by_itself(small_disk: Path) -> None:
    data_dir = small_disk / "data"
    stack = start_stack(data_dir, free_port(), {"SHESHNAG_GATEWAY_MIN_COMPLETION_WINDOW_S": "1"})
    client = Client(stack)
    filler = small_disk / "filler"
    record: dict[str, object] = {"disk_mib": DISK_MIB}
    try:
        running, running_ids, running_file = client.submit("running", LINES)
        doomed, doomed_ids, _ = client.submit("doomed", 8)
        extra = jsonl([chat_line("x-0", "Say 0.")]).getvalue()

        client.phase = "under the reserve"
        fill(filler, 16 << 20)
        deadline = time.monotonic() + 5
        while not refused_for_storage(client.upload(extra, "x.jsonl")):
            assert time.monotonic() < deadline, "uploads were not refused under the reserve"
            time.sleep(0.3)
        assert refused_for_storage(client.create(running_file))
        assert client.call("GET", "/v1/files").status_code == 200
        assert client.call("GET", f"/v1/files/{running_file}/content").status_code == 200
        assert client.call("POST", f"/v1/batches/{doomed}/cancel").status_code == 200
        overview = client.call("GET", "/v1/organization/overview").json()
        levels = {v["name"]: v["level"] for v in overview["volumes"]}
        assert levels == {"broker": "refusing", "object_store": "refusing"}, overview["volumes"]

        client.phase = "full"
        fill(filler, 0)
        full_until = time.monotonic() + 8
        while time.monotonic() < full_until:
            assert refused_for_storage(client.upload(extra, "x.jsonl"))
            assert refused_for_storage(client.create(running_file))
            assert client.batch(running)["status"] != "failed"
            time.sleep(0.5)

        client.phase = "space back"
        filler.unlink()
        freed_at = time.monotonic()
        recovered: tuple[str, list[str]] | None = None
        while recovered is None:
            assert time.monotonic() - freed_at < RECOVERY_LIMIT_S, \
                f"not serving {RECOVERY_LIMIT_S}s after space returned: {client.seen[client.phase]}"
            uploaded = client.upload(jsonl(chat_line(f"after-{i}", f"Say {i}.", max_tokens=4)
                                           for i in range(4)).getvalue(), "after.jsonl")
            if uploaded.status_code == 200:
                created = client.create(uploaded.json()["id"])
                if created.status_code == 200:
                    recovered = created.json()["id"], [f"after-{i}" for i in range(4)]
                    break
            time.sleep(1)
        record["recovery_s"] = round(time.monotonic() - freed_at, 1)

        client.phase = "after"
        for batch_id, ids in ((running, running_ids), (doomed, doomed_ids), recovered):
            batch = client.wait_ended(batch_id, 90)
            why = {name: batch.get(name) for name in ("id", "status", "status_reason", "errors", "request_counts")}
            assert batch_id == doomed or batch["status"] == "completed", why
            assert lost_and_duplicated(ids, client.lines_of(batch)) == (0, 0), batch
    finally:
        with contextlib.suppress(FileNotFoundError):
            filler.unlink()
        record["answers"] = {phase: dict(seen) for phase, seen in client.seen.items()}
        record["slowest_answer_s"] = {phase: round(s, 2) for phase, s in client.slowest.items()}
        logs = "".join(path.read_text(errors="replace") for path in (data_dir / "logs").glob("*.log"))
        record["given_up"] = logs.count("giving up on")
        record["waited_out"] = logs.count("; done again in")
        record["facts_refused"] = [line[:400] for line in logs.splitlines() if "refused from executor" in line][:10]
        with contextlib.suppress(OSError):
            said_by_up = (small_disk / f"up-{stack.port}.out").read_text(errors="replace")
            record["broker_restarts"] = said_by_up.count("restarting nats-server")
            record["object_store_restarts"] = said_by_up.count("restarting s3")
        print(json.dumps(record, indent=2))
        with contextlib.suppress(OSError):
            Path(os.environ.get(RESULTS_ENV) or small_disk.parent / "disk-full-recovery.json").write_text(
                json.dumps(record, indent=2))
        stop_stack(stack)
    every = Counter[str]()
    for seen in client.seen.values():
        every.update(seen)
    unclear = [answer for answer in every if answer.split()[2].startswith("5")
               and not answer.endswith(("insufficient_storage", "broker_unavailable", "object_store_unavailable"))]
    assert unclear == [], every
    assert record["given_up"] == 0, "a command or fact was given up during the fault"
    assert max(client.slowest.get("under the reserve", 0), client.slowest.get("full", 0)) < 3, client.slowest
