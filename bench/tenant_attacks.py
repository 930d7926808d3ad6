"""Another tenant's API latency under issue 29's attack 7 (12 clients looping `GET /metrics`, anonymously and with
a user key) against a stack as `sheshnag up` starts it: p50/p90 of the victim's `GET /v1/batches` and
`GET /v1/models`, quiet and under attack in interleaved rounds, the ratio of p50s, the attackers' answers, and the
gateway's CPU seconds (from /proc) per phase.

Usage: .venv/bin/python bench/tenant_attacks.py [--calls 300] [--rounds 2] [--attackers 12]
"""

import argparse
import asyncio
import collections
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp

from bench.cpu import cpu_seconds
from infra.embedded import free_port
from tests.e2e.conftest import ADMIN_KEY, start_stack, stop_stack


async def user_key(http: aiohttp.ClientSession, base: str, user_id: str) -> dict[str, str]:
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with http.post(f"{base}/v1/organization/users", json={"id": user_id}, headers=admin) as answer:
        assert answer.status == 200, await answer.text()
    async with http.post(f"{base}/v1/organization/keys", json={"user_id": user_id}, headers=admin) as answer:
        assert answer.status == 200, await answer.text()
        return {"Authorization": f"Bearer {(await answer.json())['value']}"}


async def victim_calls(http: aiohttp.ClientSession, base: str, key: dict[str, str], calls: int) -> list[float]:
    times = []
    for n in range(calls):
        path = "/v1/batches?limit=20" if n % 2 else "/v1/models"
        started = time.perf_counter()
        async with http.get(f"{base}{path}", headers=key) as answer:
            await answer.read()
            assert answer.status == 200, answer.status
        times.append((time.perf_counter() - started) * 1000)
    return times


async def attacker(http: aiohttp.ClientSession, base: str, headers: dict[str, str], stop: asyncio.Event,
                   answers: collections.Counter[int]) -> None:
    while not stop.is_set():
        async with http.get(f"{base}/metrics", headers=headers) as answer:
            await answer.read()
            answers[answer.status] += 1


async def run(args: argparse.Namespace, data_dir: Path) -> None:
    port = free_port()
    stack = start_stack(data_dir, port)
    base = f"http://127.0.0.1:{port}"
    rows: list[tuple[str, float, float, float, str]] = []
    try:
        gateway_pid = stack.service_pid("gateway")
        async with aiohttp.ClientSession() as http:
            victim = await user_key(http, base, "bench-victim")
            attacking_key = await user_key(http, base, "bench-attacker")
            await victim_calls(http, base, victim, 50)  # warm
            for round_ in range(args.rounds):
                for phase, headers in (("quiet", None), ("12 anonymous /metrics loops", {}),
                                       ("12 user-key /metrics loops", attacking_key)):
                    stop, answers = asyncio.Event(), collections.Counter[int]()
                    loops = [] if headers is None else [
                        asyncio.create_task(attacker(http, base, headers, stop, answers))
                        for _ in range(args.attackers)]
                    cpu_before, started = cpu_seconds(gateway_pid), time.monotonic()
                    times = await victim_calls(http, base, victim, args.calls)
                    elapsed, cpu = time.monotonic() - started, cpu_seconds(gateway_pid) - cpu_before
                    stop.set()
                    await asyncio.gather(*loops)
                    p50, p90 = statistics.median(times), statistics.quantiles(times, n=10)[8]
                    attack = ", ".join(f"{status} x{count} ({count / elapsed:.0f}/s)"
                                       for status, count in sorted(answers.items())) or "-"
                    rows.append((f"{phase} (round {round_ + 1})", p50, p90, cpu, attack))
    finally:
        stop_stack(stack)
    print(f"\nvictim's GET /v1/models and /v1/batches, {args.calls} calls a phase\n")
    print(f"| {'phase':<40} | p50 ms | p90 ms | gateway CPU s | attackers' answers |")
    print(f"|{'-' * 42}|--------|--------|---------------|--------------------|")
    for phase, p50, p90, cpu, attack in rows:
        print(f"| {phase:<40} | {p50:6.1f} | {p90:6.1f} | {cpu:13.2f} | {attack} |")
    quiet = statistics.median(p50 for phase, p50, *_ in rows if phase.startswith("quiet"))
    for kind in ("anonymous", "user-key"):
        attacked = statistics.median(p50 for phase, p50, *_ in rows if kind in phase)
        print(f"\np50 under {kind} attack ÷ quiet: {attacked / quiet:.2f} (goal ≤ 2)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--attackers", type=int, default=12)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(run(args, Path(tmp) / "data"))


if __name__ == "__main__":
    main()
