"""A validator process SIGKILLed mid-file, against the real broker and S3: its unacked fact goes to the next one,
which validates the file again; the log holds each line error and the verdict once."""

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import orjson
import pytest

from contracts.events.batch import BatchValidationFailed, LineRejected, ValidationProgressed
from contracts.events.registry import AnyEvent, decode_event
from contracts.ids import new_batch_id, new_file_id
from contracts.subjects import batch_events, input_object_key
from services.runtime.nats import eventlog
from services.runtime.nats.bus import EventBus
from services.runtime.process.settings import ConnectionSettings
from services.runtime.storage.objectstore import ObjectStore
from tests.conftest import RunningNats
from tests.factories import batch_created
from tests.support import batch_facts

LINES = 60_000
"""Long enough that the validator is still reading when it is killed (it reports progress as it reads)."""
BAD_EVERY = 1000


def content() -> bytes:
    good = orjson.dumps({"custom_id": "{}", "method": "POST", "url": "/v1/chat/completions",
                         "body": {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}})
    return b"\n".join(b"{oops" if n % BAD_EVERY == 0 else good.replace(b"{}", str(n).encode())
                      for n in range(1, LINES + 1))


async def logged(bus: EventBus, batch_id: str) -> list[AnyEvent]:
    return [decode_event(fact.data) async for fact in eventlog.read(bus, batch_events(batch_id))]


@contextmanager
def validator_process(connection: ConnectionSettings) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "SHESHNAG_NATS_URL": connection.nats_url, "SHESHNAG_S3_ENDPOINT": connection.s3_endpoint,
           "SHESHNAG_S3_ACCESS_KEY": connection.s3_access_key, "SHESHNAG_S3_SECRET_KEY": connection.s3_secret_key,
           "SHESHNAG_S3_BUCKET": connection.s3_bucket, "SHESHNAG_VALIDATOR_COUNT_TOKENS": "false",
           "SHESHNAG_VALIDATOR_MAX_LINES": str(LINES)}
    process = subprocess.Popen([sys.executable, "-m", "services.validator"], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()  # never left behind to take other tests' facts
                process.wait()


@pytest.fixture
async def own_broker(fresh_nats: RunningNats, connection: ConnectionSettings) -> AsyncIterator[
        tuple[EventBus, ConnectionSettings]]:
    """A broker of the test's own: the `validator` durable on the shared one belongs to the other validator tests
    (a validator process there would take their facts, and theirs its)."""
    own = connection.model_copy(update={"nats_url": fresh_nats.url})
    bus = await EventBus.connect(own.nats_url, "tests-validator-crash")
    yield bus, own
    await bus.close()


async def test_a_validator_killed_mid_file_leaves_the_batch_to_the_next_one_with_nothing_lost_or_doubled(
        own_broker: tuple[EventBus, ConnectionSettings], object_store: ObjectStore) -> None:
    bus, connection = own_broker
    file_id, batch_id = new_file_id(), new_batch_id()
    await object_store.put_bytes(input_object_key(file_id), content())
    with validator_process(connection) as first:
        await bus.publish(batch_created(batch_id, "key_test", input_object_key(file_id), created_at=0,
                                        expires_at=86400))
        await batch_facts(bus, batch_id, lambda fact: isinstance(fact, ValidationProgressed), timeout_s=60)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    assert not any(isinstance(f, BatchValidationFailed) for f in await logged(bus, batch_id)), \
        "the kill came after the verdict"

    with validator_process(connection):
        # The fact is redelivered once its ack wait (30 s) runs out.
        await batch_facts(bus, batch_id, lambda fact: isinstance(fact, BatchValidationFailed), timeout_s=90)
        await asyncio.sleep(1.0)  # anything the second run would publish twice is in by now
    facts = await logged(bus, batch_id)
    verdicts = [f for f in facts if isinstance(f, BatchValidationFailed)]
    assert [(v.total_lines, v.error_count) for v in verdicts] == [(LINES, LINES // BAD_EVERY)]
    rejected = [f.line for f in facts if isinstance(f, LineRejected)]
    assert rejected == list(range(BAD_EVERY, LINES + 1, BAD_EVERY))
