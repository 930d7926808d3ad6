"""What shared limits cost a request: p50/p90 of cheap authenticated calls on one gateway (real NATS, SeaweedFS and
ledger, in this process), in interleaved rounds with the limits shared (KV bucket) and with this gateway's own
counts only (the bucket made unreachable, as before limits were shared); prints a table and the ratio of p50s.

Usage: .venv/bin/python bench/shared_limits.py [--calls 1000] [--rounds 3]
"""

import argparse
import asyncio
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aiohttp.test_utils import TestClient

from infra.embedded import S3Credentials, free_port, start_nats, start_seaweed, stop_process
from services.gateway.adapters.shared_state import SharedState, SharedStateUnavailable
from services.gateway.http.auth_failures import AUTH_FAILURES
from services.gateway.http.limits import CONTROL_LIMITER
from services.runtime.process.settings import ConnectionSettings
from tests.integration.gateway_pair import key_of_role
from tests.integration.gateway_support import running_gateway


class OwnCountsOnly(SharedState):
    """The bucket never answers (and costs nothing): every decision comes from the gateway's own counts."""

    def _refuse_while_down(self) -> None:
        raise SharedStateUnavailable("bench: own counts only", first=False)


async def timed(client: TestClient[Any, Any], method: str, path: str, headers: dict[str, str], calls: int,
                body: object | None) -> list[float]:
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        answer = await client.request(method, path, headers=headers, json=body)
        await answer.read()
        times.append((time.perf_counter() - started) * 1000)
    assert answer.status in (200, 400), answer.status
    return times


async def measure(connection: ConnectionSettings, calls: int, rounds: int) -> None:
    async with running_gateway(connection, control_call_burst=10**9, control_calls_per_s=10**9) as gateway:
        app = gateway.client.app
        shared = app[AUTH_FAILURES].store
        own = OwnCountsOnly(shared.kv)
        generated = await key_of_role(gateway)
        guessable = await key_of_role(gateway, raw=f"gk-{secrets.token_hex(16)}")  # not the generated shape
        cases: dict[str, tuple[str, str, dict[str, str], object | None]] = {
            "GET /v1/models, generated key": ("GET", "/v1/models", generated, None),
            "GET /v1/models, guessable key": ("GET", "/v1/models", guessable, None),
            "POST /v1/batches {} (control call)": ("POST", "/v1/batches", generated, {})}
        samples: dict[tuple[str, str], list[float]] = {}
        for method, path, key, body in cases.values():
            await timed(gateway.client, method, path, key, calls // 4, body)  # warm up
        for _ in range(rounds):
            for mode, store in (("shared", shared), ("own", own)):
                app[AUTH_FAILURES].store = app[CONTROL_LIMITER].store = store
                for name, (method, path, key, body) in cases.items():
                    samples.setdefault((name, mode), []).extend(
                        await timed(gateway.client, method, path, key, calls, body))
    print(f"{'call':36s} {'own p50':>9s} {'shared p50':>11s} {'own p90':>9s} {'shared p90':>11s} {'p50 ratio':>10s}")
    for name in cases:
        own_ms, shared_ms = sorted(samples[name, "own"]), sorted(samples[name, "shared"])
        p90 = int(len(own_ms) * 0.9)
        print(f"{name:36s} {statistics.median(own_ms):8.3f}ms {statistics.median(shared_ms):10.3f}ms "
              f"{own_ms[p90]:8.3f}ms {shared_ms[p90]:10.3f}ms "
              f"{statistics.median(shared_ms) / statistics.median(own_ms):9.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="shared-limits-"))
    (data / "nats").mkdir()
    (data / "s3").mkdir()
    nats_port, s3_port = free_port(), free_port()
    nats = start_nats(data / "nats", nats_port, data / "nats.log")
    credentials = S3Credentials.load_or_create(data / "s3-credentials.json")
    s3 = start_seaweed(data, s3_port, credentials, data / "weed.log")
    try:
        asyncio.run(measure(ConnectionSettings(
            nats_url=f"nats://127.0.0.1:{nats_port}", s3_endpoint=f"127.0.0.1:{s3_port}",
            s3_access_key=credentials.access_key, s3_secret_key=credentials.secret_key, s3_bucket="bench"),
            args.calls, args.rounds))
    finally:
        stop_process(s3)
        stop_process(nats)


if __name__ == "__main__":
    main()
