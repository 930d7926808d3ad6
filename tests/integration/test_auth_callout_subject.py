"""Who can put a request on the auth callout subject, against a real nats-server with the embedded config: only the
server itself. The core user and executors are refused by the broker, so a worker key cannot be tried through
the responder (which would answer without the gateway's brute-force limit); what does reach it unsigned is
left unanswered (`tests/unit/authz/test_auth_callout_requests.py`)."""

import asyncio
import time
from pathlib import Path

import nats
from nats.aio.client import Client

from contracts.permissions import AUTH_CALLOUT_SUBJECT
from tests.integration.authorized_broker import WORKER_KEY, admitting_broker

REFUSED_WITHIN_S = 3.0


async def publish_violations(client: Client, errors: list[str]) -> None:
    await client.publish(AUTH_CALLOUT_SUBJECT, b"eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.e30.e30",
                         reply="_INBOX.forger")
    await client.flush()
    deadline = time.monotonic() + REFUSED_WITHIN_S
    while not any("permissions violation" in error and AUTH_CALLOUT_SUBJECT.lower() in error for error in errors):
        assert time.monotonic() < deadline, f"the publish on the callout subject was not refused; saw {errors}"
        await asyncio.sleep(0.05)


async def test_neither_the_core_user_nor_an_executor_may_publish_on_the_callout_subject(tmp_path: Path) -> None:
    async with admitting_broker(tmp_path) as running:
        for url, credentials in ((running.auth.core_url(running.port), {}),
                                 (running.url, {"user": "alpha", "password": WORKER_KEY})):
            errors: list[str] = []

            async def on_error(error: Exception, seen: list[str] = errors) -> None:
                seen.append(str(error).lower())

            client = await nats.connect(url, allow_reconnect=False, error_cb=on_error, **credentials)
            await publish_violations(client, errors)
            await client.close()
