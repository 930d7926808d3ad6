"""Validation speed: upload → verdict for a 50,000-line (~119 MiB) chat file through the real stack, against the
floor of reading the same object from S3 and parsing every line with orjson (both on one core); the validator's
peak RSS (its worker processes included); and how soon a line's error event reaches an SSE client.

The goal's ratio is wall time (create → verdict over the floor's). On a machine shared with other work, wall time
swings with the load, so the CPU seconds are printed too: the validator process's (every thread and worker
process) between create and verdict, against the floor's own (this process's, reading and parsing).

Usage: .venv/bin/python bench/validation.py [--lines 50000] [--broken 5000]
The executor serves only the embedding model here, so the valid chat batch stays `validated` and nothing runs.
"""

import argparse
import io
import json
import random
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
from services.runtime.objectstore import ObjectStore
from services.runtime.settings import ConnectionSettings
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


def run_variant(stack: RunningStack, content: bytes) -> dict[str, float | str]:
    client = stack.client(ADMIN_KEY)
    upload = io.BytesIO(content)
    upload.name = "bench.jsonl"
    started = time.perf_counter()
    file = client.files.create(file=upload, purpose="batch")
    uploaded = time.perf_counter()
    validator = stack.service_pid("validator")
    rss = PeakRss(validator)
    rss.start()
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
    rss.running = False
    listener.join(timeout=30)
    return {"status": batch.status, "upload_s": uploaded - started, "verdict_s": verdict - created,
            "total_s": verdict - started, "cpu_s": cpu, "peak_rss_mb": rss.peak / 2**20,
            "first_error_ms": latencies[0] * 1000 if latencies else float("nan"), "file_id": file.id}


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
    args = parser.parse_args()
    good, bad = make_file(args.lines, 0), make_file(args.lines, args.broken)
    with tempfile.TemporaryDirectory() as tmp:
        stack = start_stack(Path(tmp) / "data", free_port(), {
            "SHESHNAG_EXECUTOR_MODELS": '["smollm2-135m-embed"]',
            "SHESHNAG_GATEWAY_MAX_UPLOAD_BYTES": str(200 * 2**20)})
        try:
            results = {"valid": run_variant(stack, good), "broken": run_variant(stack, bad)}
            floor, floor_cpu = floor_seconds(stack, f"files/{results['valid']['file_id']}")
        finally:
            stop_stack(stack)
    print(f"\n{args.lines} lines, {len(good) / 2**20:.1f} MiB; broken variant with {args.broken} bad lines\n")
    print("| variant | verdict | upload s | upload→verdict s | create→verdict s | floor s | ratio | validator CPU s | "
          "floor CPU s | CPU ratio | peak RSS MB | first error ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['status']} | {r['upload_s']:.2f} | {r['total_s']:.2f} | {r['verdict_s']:.2f} | "
              f"{floor:.2f} | {float(r['verdict_s']) / floor:.2f} | {r['cpu_s']:.2f} | {floor_cpu:.2f} | "
              f"{float(r['cpu_s']) / floor_cpu:.2f} | {r['peak_rss_mb']:.0f} | {r['first_error_ms']:.1f} |")


if __name__ == "__main__":
    main()
