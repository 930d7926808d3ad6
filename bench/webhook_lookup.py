"""What one batch fact's webhook lookup costs a gateway as other tenants register endpoints: the way it was (every
endpoint of every tenant listed and decoded per fact) against the directory (`services/gateway/webhooks/directory.py`:
one read of the bucket's newest endpoint write, then an in-memory lookup by owner), both against a real nats-server
with N endpoints of other tenants in the webhooks bucket. CPU ms of this process per fact (from the kernel's count of
its CPU time, steadier than wall time).

Usage: .venv/bin/python bench/webhook_lookup.py [--endpoints 100 1000 10000] [--rounds 20]
"""

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from contracts.api.webhook import WebhookEndpoint
from infra.embedded import free_port, venv_binary
from services.gateway.webhooks.directory import EndpointDirectory
from services.gateway.webhooks.store import ENDPOINT
from services.runtime.nats.bus import EventBus
from services.runtime.nats.kv import latest_entries, open_bucket
from services.runtime.nats.kv_watch import keep

PER_OWNER = 20
"""Endpoints per other tenant (the default limit)."""
AT_MS = 2_000_000_000_000


def endpoint(n: int) -> WebhookEndpoint:
    return WebhookEndpoint(id=f"wh_{n:024x}", url="https://example.com/hook", events=["batch.completed"], scope="user",
                           owner=f"user-other-{n // PER_OWNER}", organization_id="org_other", enabled=True,
                           description="", created_at=1, secret="whsec_" + "A" * 43)


async def measure(url: str, count: int, rounds: int) -> tuple[float, float]:
    bus = await EventBus.connect(url, "bench-webhook-lookup", declare=False)
    try:
        kv = await open_bucket(bus, f"bench_webhooks_{count}")
        for n in range(count):
            await kv.put(f"{ENDPOINT}.{endpoint(n).id}", endpoint(n).model_dump_json().encode())
        directory = EndpointDirectory()
        keeping = asyncio.create_task(keep(kv, f"{ENDPOINT}.*", directory, "bench"))
        await directory.ready.wait()
        started = time.process_time()
        for _ in range(rounds):
            listed = [WebhookEndpoint.model_validate_json(value) for _, value in await latest_entries(kv, "endpoint.*")]
            assert len(listed) == count
        listing = (time.process_time() - started) / rounds * 1000
        started = time.process_time()
        for _ in range(rounds):
            found = await directory.current_endpoints(kv)
            found.receivers("batch.completed", "user-other-0", "org_other", AT_MS)
        lookup = (time.process_time() - started) / rounds * 1000
        keeping.cancel()
        await asyncio.gather(keeping, return_exceptions=True)
        return listing, lookup
    finally:
        await bus.close()


async def run(url: str, args: argparse.Namespace) -> None:
    await asyncio.sleep(1.0)  # the server starting
    print("| other tenants' endpoints | every endpoint listed and decoded, CPU ms per fact | directory lookup, "
          "CPU ms per fact |\n|---|---|---|")
    for count in args.endpoints:
        listing, lookup = await measure(url, count, args.rounds)
        print(f"| {count:,} | {listing:.2f} | {lookup:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoints", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory() as store:
        server = subprocess.Popen([venv_binary("nats-server"), "-js", "-sd", store, "-a", "127.0.0.1", "-p", str(port)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            asyncio.run(run(f"nats://127.0.0.1:{port}", args))
        finally:
            server.terminate()
            server.wait(timeout=10)


if __name__ == "__main__":
    main()
