"""Completion tokens/s: the same chat lines run directly on xllamacpp and as a batch through the whole stack.

Usage: .venv/bin/python bench/throughput.py [--lines 64] [--max-tokens 64]
Both runs use the catalogue's slots and context for the model, two threads, and `ignore_eos` so every line
generates exactly max_tokens; the direct run is the baseline the stack is compared with.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import xllamacpp
from openai import OpenAI

from infra.embedded import free_port
from services.runtime.storage.catalogue import load_catalogue, resolve_artifact
from tests.e2e.conftest import ADMIN_KEY, start_stack, stop_stack
from tests.factories import Line, run_batch, upload, upload_when_key_known

MODEL = "smollm2-135m-instruct-q4_1"
PROMPTS = ["Write a short poem about the sea.", "Explain what a batch API is.", "List three fruits.",
           "Describe a cat in one sentence."]


def bodies(lines: int, max_tokens: int) -> list[dict[str, object]]:
    return [{"model": MODEL, "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
             "max_tokens": max_tokens, "seed": i, "temperature": 0.7, "ignore_eos": True} for i in range(lines)]


def run_direct(requests: list[dict[str, object]]) -> tuple[float, int]:
    entry = load_catalogue(None).resolve(MODEL)
    assert entry is not None
    params = xllamacpp.CommonParams()
    params.model.path = str(resolve_artifact(entry.artifact))
    params.n_parallel = entry.slots
    params.n_ctx = entry.slots * entry.context_length
    params.cpuparams.n_threads = int(os.environ.get("SHESHNAG_EXECUTOR_N_THREADS", "2"))
    params.cpuparams_batch.n_threads = params.cpuparams.n_threads
    server = xllamacpp.Server(params)
    started = time.perf_counter()
    with ThreadPoolExecutor(len(requests)) as pool:
        replies = list(pool.map(server.handle_chat_completions, requests))
    elapsed = time.perf_counter() - started
    del server
    return elapsed, sum(int(r["usage"]["completion_tokens"]) for r in replies)


def run_stack(requests: list[dict[str, object]], tracing: bool = False) -> tuple[float, int]:
    """`tracing`: every service builds and exports its spans (console exporter into its log, batched)."""
    saved = os.environ.get("OTEL_TRACES_EXPORTER")
    os.environ["OTEL_TRACES_EXPORTER"] = "console" if tracing else "none"
    try:
        return _run_stack(requests)
    finally:
        os.environ.pop("OTEL_TRACES_EXPORTER")
        if saved is not None:
            os.environ["OTEL_TRACES_EXPORTER"] = saved


def _run_stack(requests: list[dict[str, object]]) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as tmp:
        stack = start_stack(Path(tmp) / "data", free_port())
        try:
            client = stack.client(ADMIN_KEY)
            lines: list[Line] = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
                     for i, body in enumerate(requests)]
            file_id = upload_when_key_known(client, lines, "bench.jsonl")
            warm_up(client, requests[0])  # services finish starting (tokenizer, model, registration) untimed
            started = time.perf_counter()
            batch = run_batch(client, file_id)
            elapsed = time.perf_counter() - started
            if batch.status != "completed" or batch.output_file_id is None:
                raise RuntimeError(f"batch ended {batch.status}: {batch.model_dump()}")
            output = client.files.content(batch.output_file_id).text.splitlines()
            tokens = sum(json.loads(line)["response"]["body"]["usage"]["completion_tokens"] for line in output)
            return elapsed, tokens
        finally:
            stop_stack(stack)


def warm_up(client: OpenAI, body: dict[str, object]) -> None:
    line: Line = {"custom_id": "warm-up", "method": "POST", "url": "/v1/chat/completions",
                  "body": {**body, "max_tokens": 1}}
    run_batch(client, upload(client, [line], "warm-up.jsonl"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--tracing", type=int, default=0, metavar="N",
                        help="also run the stack N times with tracing off and N with it on, alternating")
    args = parser.parse_args()
    requests = bodies(args.lines, args.max_tokens)
    direct_s, direct_tokens = run_direct(requests)
    stack_s, stack_tokens = run_stack(requests)
    direct_rate, stack_rate = direct_tokens / direct_s, stack_tokens / stack_s
    print(f"\n{args.lines} chat lines, max_tokens {args.max_tokens}, ignore_eos, fixed seeds\n")
    print("| run | wall s | completion tokens | completion tok/s | ratio |")
    print("|---|---|---|---|---|")
    print(f"| xllamacpp direct (baseline) | {direct_s:.2f} | {direct_tokens} | {direct_rate:.1f} | 1.00 |")
    print(f"| batch through the stack | {stack_s:.2f} | {stack_tokens} | {stack_rate:.1f} | "
          f"{stack_rate / direct_rate:.2f} |")
    if args.tracing:
        compare_tracing(requests, args.tracing, direct_rate)


def compare_tracing(requests: list[dict[str, object]], repeats: int, direct_rate: float) -> None:
    rates: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(repeats):
        for tracing in (False, True):
            elapsed, tokens = run_stack(requests, tracing)
            rates[tracing].append(tokens / elapsed)
    off, on = statistics.median(rates[False]), statistics.median(rates[True])
    print(f"\ntracing off vs on, median of {repeats} alternating runs each\n")
    print("| run | completion tok/s (each run) | median | ratio to direct |")
    print("|---|---|---|---|")
    for label, tracing, median in (("tracing off", False, off), ("tracing on", True, on)):
        each = ", ".join(f"{rate:.1f}" for rate in rates[tracing])
        print(f"| {label} | {each} | {median:.1f} | {median / direct_rate:.2f} |")
    print(f"\ntracing costs {100 * (1 - on / off):.1f}% of batch throughput")


if __name__ == "__main__":
    main()
