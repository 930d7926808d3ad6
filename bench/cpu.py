"""CPU seconds a process has spent (user + system, from /proc through psutil): steadier than wall time on a shared
machine, so the benches compare these."""

import json
import time

import psutil


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def reference_cpu_ms(rounds: int = 3) -> float:
    """CPU milliseconds this process spends on a fixed pure-Python workload (JSON in and out, dict and string work,
    as the services' own), the least of `rounds` tries. The same code costs up to three times as much CPU on a
    crowded host as on a quiet one, which /proc cannot see: benches print this beside their figures, so runs made at
    different times compare by their ratio to it."""
    fact = {"type": "batch.progressed", "aggregate_id": "batch_0123456789ab", "completed": 3, "failed": 0,
            "usage": {"input_tokens": 120, "output_tokens": 48}, "chunk_key": "results/batch_0/attempt-1/chunk-1"}
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        for n in range(20_000):
            decoded = json.loads(json.dumps({**fact, "completed": n}))
            "-".join(sorted(decoded)).encode().hex()
        best = min(best, (time.process_time() - started) * 1000)
    return best
