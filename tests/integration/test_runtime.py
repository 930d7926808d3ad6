"""The shared adapters against the real broker and the real S3 server."""

import asyncio
import uuid
from typing import Any

import nats.js.errors
import pytest
from faststream import ContextRepo
from faststream.nats.message import NatsMessage
from nats.js.api import DeliverPolicy

from contracts.commands import FinalizeBatch
from contracts.events.batch import LineRejected
from contracts.events.key import UserCreated
from contracts.events.organization import OrganizationCreated
from contracts.subjects import EVENTS_STREAM, WORK_STREAM, batch_events, executor_finalize_durable
from contracts.terms import BatchTerms
from services.runtime.nats.broker import ServiceBroker
from services.runtime.nats.bus import ConsumerPolicy, EventBus
from services.runtime.nats.delivery import Durable, ServiceRouter
from services.runtime.process.logfmt import BATCH_ID
from services.runtime.process.settings import ConnectionSettings
from services.runtime.storage.objectstore import ObjectStore


async def test_the_same_fact_published_twice_is_stored_once(bus: EventBus) -> None:
    event = LineRejected(aggregate_id="batch_dedup1", line=4, code="invalid_json", message="not JSON")
    first = await bus.publish(event)
    again = await bus.publish(LineRejected(aggregate_id="batch_dedup1", line=4, code="invalid_json",
                                           message="not JSON"))
    assert first == again
    received: list[int] = []
    sub = await bus.js.subscribe(batch_events("batch_dedup1"), ordered_consumer=True,
                                 deliver_policy=DeliverPolicy.ALL)
    message = await sub.next_msg(timeout=2)
    received.append(message.metadata.sequence.stream)
    assert message.metadata.num_pending == 0
    await sub.unsubscribe()
    assert received == [first]


async def test_facts_of_two_kinds_with_one_aggregate_id_and_name_are_two_facts(bus: EventBus) -> None:
    aggregate_id = f"acme-{uuid.uuid4().hex[:8]}"  # an id an admin chooses for both a user and an organisation

    user = await bus.publish(UserCreated(aggregate_id=aggregate_id, organization_id=aggregate_id))
    organization = await bus.publish(OrganizationCreated(aggregate_id=aggregate_id))

    assert user != organization
    assert organization == await bus.publish(OrganizationCreated(aggregate_id=aggregate_id))  # a repeat is one fact


async def test_a_command_sent_twice_is_handled_once_with_its_batch_as_the_context(
        bus: EventBus, connection: ConnectionSettings) -> None:
    """Its subject names only the executor: the consumer takes the batch from the command's header (the
    executor's object requests are allowed for that batch alone)."""
    await bus.ensure_streams()
    executor_id = f"ctx-{uuid.uuid4().hex[:8]}"
    command = FinalizeBatch(batch_id="batch_ctx1", executor_id=executor_id, reason="expired",
                            terms=BatchTerms(owner_key_id="key_1", endpoint="/v1/chat/completions",
                                             input_object_key="files/file_1"))
    await bus.send(command)
    await bus.send(command)
    handled: list[tuple[str, str]] = []
    done = asyncio.Event()

    async def handle(context: ContextRepo, finalize: FinalizeBatch) -> None:
        message: NatsMessage = context.get_local("message")  # the one being handled
        handled.append((message.raw_message.subject, BATCH_ID.get()))
        done.set()

    durable = executor_finalize_durable(executor_id)
    router = ServiceRouter("tests", dependencies="tests-context")
    router.durable(Durable(FinalizeBatch, WORK_STREAM, durable, command.subject, ConsumerPolicy()), handle, None,
                   "under test")
    broker = (await EventBus.connect(connection.nats_url, "tests")).broker
    broker.include_router(router)
    broker.context.set_global("tests-context", broker.context)
    await broker.start()
    try:
        await asyncio.wait_for(done.wait(), 10)
        await asyncio.sleep(0.5)  # a second delivery, were there one, would have come by now
    finally:
        await broker.stop()
    assert handled == [(command.subject, "batch_ctx1")]
    assert (await bus.js.consumer_info(WORK_STREAM, durable)).num_pending == 0
    assert BATCH_ID.get() == ""


async def test_objects_stream_back_line_by_line(object_store: ObjectStore) -> None:
    body = b"".join(f'{{"n": {i}}}\n'.encode() for i in range(5000)) + b"last-without-newline"
    await object_store.put_bytes("tests/lines.jsonl", body)
    lines = [line async for line in object_store.iter_lines("tests/lines.jsonl")]
    assert len(lines) == 5001
    assert lines[0] == b'{"n": 0}' and lines[-1] == b"last-without-newline"


async def test_streams_are_declared_once_by_every_service(bus: EventBus) -> None:
    await asyncio.gather(bus.ensure_streams(), bus.ensure_streams())
    info = await bus.js.stream_info(EVENTS_STREAM)
    assert info.config.duplicate_window and info.config.duplicate_window >= 3600


async def test_a_fenced_publish_is_refused_once_a_newer_fact_is_on_the_fence_subject(bus: EventBus) -> None:
    from contracts.events.batch import AttemptFailed, BatchProgressed
    from contracts.subjects import attempt_failures
    from services.runtime.nats.bus import Fence, FenceMoved

    batch = "batch_fence1"

    def progress(chunk: int) -> BatchProgressed:
        return BatchProgressed(aggregate_id=batch, attempt=1, chunk=chunk, chunk_key=f"k{chunk}", completed=chunk,
                               failed=0)

    fence = Fence(attempt_failures(batch), 0)
    await bus.publish(progress(0), fence)
    failed_at = await bus.publish(AttemptFailed(aggregate_id=batch, attempt=1, executor_id="e", code="executor_lost",
                                                reason="paused"))
    try:
        await bus.publish(progress(1), fence)
    except FenceMoved as moved:
        assert moved.last_sequence == failed_at
    else:
        raise AssertionError("a publish behind a moved fence was accepted")
    await bus.publish(progress(2), Fence(attempt_failures(batch), failed_at))  # a writer that saw the move
    info = await bus.js.consumer_info(EVENTS_STREAM, (await bus.js.add_consumer(
        EVENTS_STREAM, filter_subject=batch_events(batch))).name)
    assert info.num_pending == 3


async def test_a_connect_whose_streams_cannot_be_declared_leaves_no_connection_open(
        connection: ConnectionSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[ServiceBroker] = []
    to = ServiceBroker.to

    def recorded(*args: Any, **kwargs: Any) -> ServiceBroker:
        opened.append(to(*args, **kwargs))
        return opened[-1]

    async def refused(self: EventBus) -> None:
        raise nats.js.errors.ServiceUnavailableError()

    monkeypatch.setattr(ServiceBroker, "to", recorded)
    monkeypatch.setattr(EventBus, "ensure_streams", refused)
    with pytest.raises(nats.js.errors.ServiceUnavailableError):
        await EventBus.connect(connection.nats_url, "test-declare-refused", attempts=1)
    assert len(opened) == 1
    assert opened[0]._connection is None or opened[0]._connection.is_closed


async def test_a_command_sent_again_in_another_protocols_shape_is_another_message(bus: EventBus) -> None:
    """An executor gone back to protocol 1 drops a nested command it cannot read; the command sent again flat must
    reach it, not be dropped as a repeat of the nested one."""
    await bus.ensure_streams()
    command = FinalizeBatch(batch_id="batch_shapes1", executor_id=f"shape-{uuid.uuid4().hex[:8]}", reason="expired",
                            terms=BatchTerms(owner_key_id="key_1", endpoint="/v1/chat/completions",
                                             input_object_key="files/file_1"))
    for protocol in (2, 2, 1, 1):
        await bus.send(command, protocol)
    stored = (await bus.js.stream_info(WORK_STREAM, subjects_filter=command.subject)).state.subjects or {}
    assert stored == {command.subject: 2}
