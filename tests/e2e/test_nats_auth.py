"""The stack's broker as `sheshnag up` runs it: only the core user and executors admitted by worker key get in."""

import asyncio
import time

import nats
import nats.errors
import pytest

from infra.nats_auth import NatsAuth
from tests.e2e.conftest import RunningStack

pytestmark = pytest.mark.e2e


async def test_the_broker_refuses_anonymous_and_wrong_credentials_and_admits_the_executor(
        stack: RunningStack) -> None:
    url = f"nats://127.0.0.1:{stack.nats_port}"
    for credentials in ({}, {"user": "local-0", "password": "wk-not-a-key"}, {"user": "core", "password": "guess"}):
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await nats.connect(url, allow_reconnect=False, connect_timeout=5, **credentials)
    core = await nats.connect(NatsAuth.load_or_create(stack.data_dir).core_url(stack.nats_port),
                              allow_reconnect=False)
    await core.close()
    deadline = time.monotonic() + 60  # the gateway answers before the ledger has folded the worker key
    while "executor local-0 admitted to NATS" not in stack.log("scheduler"):
        assert time.monotonic() < deadline, "the executor was never admitted"
        await asyncio.sleep(0.2)
    assert "Publish Violation" not in stack.log("nats"), "the executor stepped outside its permissions"
