"""Validation speed: upload → verdict for a 50,000-line (~119 MiB) chat file through the real stack, against the
floor of reading the same object from S3 and parsing every line with orjson (both on one core); the validator's
peak RSS (its worker processes included); and how soon a line's error event reaches an SSE client.

The goal's figure is the CPU ratio: the validator process's CPU seconds (every thread and worker process) between
create and verdict, over the floor's own (this process's, reading and parsing). Other work shares the machine's
cores, so wall time swings with the load; the wall ratio (create → verdict over the floor's) is printed beside it.

Usage: .venv/bin/python bench/validation.py [--lines 50000] [--broken 5000] [--rounds 1] [--profile DIR]
The executor serves only the embedding model here, so the valid chat batch stays `validated` and nothing runs.
"""

import argparse
import io
import json
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx2
import orjson
import psutil

from bench.cpu import cpu_seconds
from infra.embedded import free_port
from services.runtime.process.settings import ConnectionSettings
from services.runtime.storage.objectstore import ObjectStore
from tests.e2e.conftest import ADMIN_KEY, RunningStack, start_stack, stop_stack

WORDS = ("batch request model token latency stream queue worker memory cluster prompt answer summary report "
         "customer invoice shipping weather history science music travel garden kitchen").split()
BROKEN_KINDS = ("invalid_json", "missing_field", "duplicate_custom_id", "unsupported_model", "invalid_body",
                "stream_not_supported", "url_mismatch", "unsupported_parameter")


def chat_line(index: int, rng: random.Random) -> dict[str, object]:
    text = " ".join(rng.choice(WORDS) for _ in range(300))
    return {"custom_id": f"req-{index:06d}", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "smollm2", "max_tokens": 128, "temperature": 0.7, "seed": index,
                     "messages": [{"role": "system", "content": "You are a careful assistant who answers briefly."},
                                  {"role": "user", "content": f"Summarise this note: {text}"}]}}


def broken(index: int, line: dict[str, object], kind: str) -> bytes:
    body = dict(line["body"])  # type: ignore[call-overload]
    if kind == "invalid_json":
        return orjson.dumps(line)[:-3]
    if kind == "missing_field":
        return orjson.dumps({k: v for k, v in line.items() if k != "method"})
    if kind == "duplicate_custom_id":
        return orjson.dumps({**line, "custom_id": "req-000000"})
    changes = {"unsupported_model": {"model": "gpt-4o"}, "invalid_body": {"temperature": 9},
               "stream_not_supported": {"stream": True}, "unsupported_parameter": {"temprature": 1}}
    if kind == "url_mismatch":
        return orjson.dumps({**line, "url": "/v1/completions"})
    body.update(changes[kind])
    return orjson.dumps({**line, "body": body})


def make_file(lines: int, broken_lines: int, seed: int = 1) -> bytes:
    rng = random.Random(seed)
    bad = set(rng.sample(range(1, lines), broken_lines)) if broken_lines else set()
    out = io.BytesIO()
    for index in range(lines):
        line = chat_line(index, rng)
        out.write(broken(index, line, BROKEN_KINDS[index % len(BROKEN_KINDS)]) if index in bad else orjson.dumps(line))
        out.write(b"\n")
    return out.getvalue()


class PeakRss(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.process = psutil.Process(pid)
        self.peak = 0
        self.running = True

    def run(self) -> None:
        """The validator's RSS with its line-checking worker processes' added (they share little with it)."""
        while self.running:
            try:
                processes = [self.process, *self.process.children(recursive=True)]
                self.peak = max(self.peak, sum(p.memory_info().rss for p in processes))
            except psutil.NoSuchProcess:
                pass
            time.sleep(0.02)


def floor_seconds(stack: RunningStack, object_key: str) -> tuple[float, float]:
    """(wall, CPU) seconds of reading the object from S3 and parsing each line."""
    creds = json.loads((stack.data_dir / "s3-credentials.json").read_text())
    settings = ConnectionSettings(s3_endpoint=stack.s3_endpoint, s3_access_key=creds["access_key"],
                                  s3_secret_key=creds["secret_key"])
    client = ObjectStore.from_settings(settings).client
    started, cpu_started = time.perf_counter(), time.process_time()
    response = client.get_object(settings.s3_bucket, object_key)
    pending = b""
    for chunk in response.stream(256 * 1024):
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line:
                orjson.loads(line)
    response.close()
    return time.perf_counter() - started, time.process_time() - cpu_started


def run_variant(stack: RunningStack, content: bytes, profile: Path | None = None) -> dict[str, float | str]:
    client = stack.client(ADMIN_KEY)
    upload = io.BytesIO(content)
    upload.name = "bench.jsonl"
    started = time.perf_counter()
    file = client.files.create(file=upload, purpose="batch")
    uploaded = time.perf_counter()
    validator = stack.service_pid("validator")
    rss = PeakRss(validator)
    rss.start()
    spy = profiler(validator, profile)
    cpu_before = validator_cpu(validator)
    latencies: list[float] = []
    batch = client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")
    created = time.perf_counter()
    listener = threading.Thread(target=first_error_latency, args=(stack, batch.id, latencies), daemon=True)
    listener.start()
    while batch.status == "validating":
        time.sleep(0.05)
        batch = client.batches.retrieve(batch.id)
    verdict = time.perf_counter()
    cpu = validator_cpu(validator) - cpu_before
    if spy is not None:
        spy.send_signal(2)  # py-spy writes its profile on SIGINT
        spy.wait(30)
    rss.running = False
    listener.join(timeout=30)
    return {"status": batch.status, "upload_s": uploaded - started, "verdict_s": verdict - created,
            "total_s": verdict - started, "cpu_s": cpu, "peak_rss_mb": rss.peak / 2**20,
            "first_error_ms": latencies[0] * 1000 if latencies else float("nan"), "file_id": file.id}


def profiler(pid: int, out: Path | None) -> subprocess.Popen[bytes] | None:
    """py-spy sampling the validator (its worker processes too) 500 times a second into `out` (raw collapsed stacks,
    for bench/profile_top.py); None without `--profile`."""
    if out is None:
        return None
    spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "-p", str(pid), "--rate", "500",
                            "--subprocesses", "--threads", "--gil", "--format", "raw", "-o", str(out)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1)  # attached before the batch is created
    return spy


def validator_cpu(pid: int) -> float:
    """CPU seconds of the validator and its worker processes."""
    return cpu_seconds(pid) + sum(cpu_seconds(child.pid) for child in psutil.Process(pid).children(recursive=True))


def first_error_latency(stack: RunningStack, batch_id: str, out: list[float]) -> None:
    """Receive time of the first line error minus when the validator emitted it (its occurred_at)."""
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    with httpx2.stream("GET", f"{stack.base_url}/batches/{batch_id}/events", headers=headers, timeout=120) as events:
        event_name = ""
        for line in events.iter_lines():
            if line.startswith("event: "):
                event_name = line.removeprefix("event: ")
            elif line.startswith("data: ") and event_name == "batch.line_rejected":
                occurred = json.loads(line.removeprefix("data: "))["occurred_at"] / 1000
                out.append(time.time() - occurred)
                return
            elif event_name in ("batch.validated", "batch.validation_failed"):
                return


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--broken", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=1, help="each variant this many times, alternating; medians")
    parser.add_argument("--profile", type=Path, default=None,
                        help="a folder: py-spy samples the validator during each variant (VARIANT-ROUND.txt)")
    args = parser.parse_args()
    size = 0
    rounds: list[dict[str, dict[str, float | str]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        stack = start_stack(Path(tmp) / "data", free_port(), {
            "SHESHNAG_EXECUTOR_MODELS": '["smollm2-135m-embed"]',
            "SHESHNAG_GATEWAY_MAX_UPLOAD_BYTES": str(200 * 2**20)})
        try:
            for number in range(args.rounds):
                # Each round's files are new: the same bytes again are the same file, and its live batch is returned.
                good, bad = make_file(args.lines, 0, seed=2 * number + 1), make_file(args.lines, args.broken,
                                                                                     seed=2 * number + 2)
                size = len(good)
                results = {name: run_variant(stack, content, profile_path(args.profile, name, number))
                           for name, content in (("valid", good), ("broken", bad))}
                floor, floor_cpu = floor_seconds(stack, f"files/{results['valid']['file_id']}")
                for r in results.values():
                    r.update(floor_s=floor, floor_cpu_s=floor_cpu, ratio=float(r["verdict_s"]) / floor,
                             cpu_ratio=float(r["cpu_s"]) / floor_cpu)
                rounds.append(results)
        finally:
            stop_stack(stack)
    report(args, size, rounds)


def profile_path(folder: Path | None, variant: str, number: int) -> Path | None:
    if folder is None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{variant}-{number}.txt"


def report(args: argparse.Namespace, size: int, rounds: list[dict[str, dict[str, float | str]]]) -> None:
    print(f"\n{args.lines} lines, {size / 2**20:.1f} MiB; broken variant with {args.broken} bad lines; "
          f"{len(rounds)} round(s), medians\n")
    print("| variant | verdict | upload s | create→verdict s | floor s | wall ratio | validator CPU s | "
          "floor CPU s | CPU ratio (goal <= 3x) | peak RSS MB | first error ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    goal: list[str] = []
    for name in rounds[0]:
        runs = [results[name] for results in rounds]

        def median(key: str, runs: list[dict[str, float | str]] = runs) -> float:
            return statistics.median(float(r[key]) for r in runs)

        print(f"| {name} | {runs[0]['status']} | {median('upload_s'):.2f} | {median('verdict_s'):.2f} | "
              f"{median('floor_s'):.2f} | {median('ratio'):.2f} | {median('cpu_s'):.2f} | {median('floor_cpu_s'):.2f} "
              f"| {median('cpu_ratio'):.2f} | {median('peak_rss_mb'):.0f} | {median('first_error_ms'):.1f} |")
        each = ", ".join(f"{float(r['cpu_ratio']):.2f}" for r in runs)
        goal.append(f"{name} {median('cpu_ratio'):.2f}x (rounds: {each})")
    print("\nGoal figure, validator CPU ÷ floor CPU (one core, <= 3x): " + "; ".join(goal))


if __name__ == "__main__":
    main()
