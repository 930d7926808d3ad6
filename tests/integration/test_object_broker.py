"""Executors without S3 credentials, against a real nats-server run with auth callout and the real S3 server: the
object broker signs URLs for their own work's objects only, and their NATS identity is who asks."""

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from contracts.events.batch import BatchAssigned, BatchValidated
from contracts.ids import output_file_id
from contracts.objects import LIST_PAGE, WantedObject
from contracts.subjects import OBJECT_REQUESTS, input_object_key, result_chunk_key
from services.executor.adapters import broker
from services.executor.adapters.brokered_store import (
    BrokeredObjectStore,
    ObjectAccessRefused,
    ObjectBrokerUnavailable,
    http_pool,
)
from services.runtime.nats.bus import EventBus
from services.runtime.process.logfmt import BATCH_ID
from services.runtime.process.settings import ConnectionSettings
from services.runtime.storage.objectstore import ObjectStore
from services.scheduler.book import Book
from services.scheduler.objects import OBJECT_REQUESTS as OBJECT_ANSWERS
from services.scheduler.objects import ObjectBroker, ObjectSigner
from tests.factories import batch_created
from tests.integration.authorized_broker import OTHER_WORKER_KEY, WORKER_KEY, AuthorizedBroker, admitting_broker
from tests.integration.router_support import bare


@dataclass
class Work:
    """Two running batches, b1 on alpha and b2 on bravo, with their input files in the object store."""

    b1: str
    b2: str
    input1: str
    input2: str
    stranger: str
    """A file no batch reads."""
    book: Book


@contextlib.contextmanager
def working_on(batch_id: str) -> Iterator[None]:
    """As the executor's consumer does while it handles a command of the batch."""
    token = BATCH_ID.set(batch_id)
    try:
        yield
    finally:
        BATCH_ID.reset(token)


@pytest.fixture
async def work(object_store: ObjectStore) -> Work:
    suffix = secrets.token_hex(4)
    b1, b2 = f"batch_one{suffix}", f"batch_two{suffix}"
    input1, input2, stranger = (input_object_key(f"file-{name}{suffix}") for name in ("in1", "in2", "secret"))
    book = Book(admitted={"alpha", "bravo"})
    for batch, key, executor in ((b1, input1, "alpha"), (b2, input2, "bravo")):
        await object_store.put_bytes(key, f"{batch} line 1\n{batch} line 2\n".encode())
        book.apply(batch_created(batch, "k", key, created_at=0, expires_at=10**10))
        # Lines enough for more than a listing page of chunks (an attempt has no more chunks than lines).
        book.apply(BatchValidated(aggregate_id=batch, total_lines=2 * LIST_PAGE, model="m"))
        book.apply(BatchAssigned(aggregate_id=batch, executor_id=executor, attempt=1, lease_token="t"))
    await object_store.put_bytes(stranger, b"someone else's data\n")
    return Work(b1, b2, input1, input2, stranger, book)


@dataclass
class Brokered:
    auth: AuthorizedBroker
    signer: ObjectSigner
    alpha: EventBus


@pytest.fixture
async def brokered(tmp_path: Path, connection: ConnectionSettings) -> AsyncIterator[Brokered]:
    """A broker admitting executors by worker key, and executor alpha connected to it with its own."""
    async with admitting_broker(tmp_path) as running:
        signer = ObjectSigner.from_settings(connection, "", expiry_s=900)
        alpha = await broker.join(running.executor_settings("alpha", WORKER_KEY), asyncio.Event())
        assert alpha is not None
        try:
            yield Brokered(running, signer, alpha)
        finally:
            await alpha.close()


async def answering(brokered: Brokered, book: Book, caught_up: asyncio.Event | None = None) -> Subscription:
    """The leading scheduler's object broker, on its core connection."""
    ready = caught_up or asyncio.Event()
    if caught_up is None:
        ready.set()
    objects = ObjectBroker(brokered.signer, book, ready)
    return await brokered.auth.core.nc.subscribe(OBJECT_REQUESTS, cb=bare(OBJECT_ANSWERS, objects.answer))


async def test_an_executor_reads_its_input_and_writes_lists_and_reads_its_chunks(
        brokered: Brokered, work: Work, object_store: ObjectStore) -> None:
    await answering(brokered, work.book)
    store = BrokeredObjectStore(brokered.alpha.nc, "alpha", http_pool(), wait_s=5)
    with working_on(work.b1):
        assert [line async for line in store.iter_lines(work.input1)] == [
            f"{work.b1} line 1".encode(), f"{work.b1} line 2".encode()]
        written = {result_chunk_key(work.b1, 1, number): f'{{"chunk": {number}}}\n'.encode()
                   for number in range(LIST_PAGE + 3)}  # more than one page of listing
        for key, data in written.items():
            await store.put_bytes(key, data)
        assert await store.list_keys(f"results/{work.b1}/") == sorted(written)
        for key in (result_chunk_key(work.b1, 1, 0), result_chunk_key(work.b1, 1, LIST_PAGE + 2)):
            assert await store.get_bytes(key) == written[key]
        await store.put_bytes(input_object_key(output_file_id(work.b1)), b"output\n")
    assert await object_store.get_bytes(result_chunk_key(work.b1, 1, 7)) == written[result_chunk_key(work.b1, 1, 7)]
    assert await object_store.get_bytes(input_object_key(output_file_id(work.b1))) == b"output\n"


async def test_what_an_attempt_asks_ahead_comes_in_one_answer_and_only_what_it_may_reach_alone(
        brokered: Brokered, work: Work, object_store: ObjectStore) -> None:
    await answering(brokered, work.book)
    asked: list[str] = []

    async def overheard(message: Msg) -> None:
        asked.append(message.subject)

    await brokered.auth.core.nc.subscribe(OBJECT_REQUESTS, cb=overheard)
    store = BrokeredObjectStore(brokered.alpha.nc, "alpha", http_pool(), wait_s=5)
    own_chunk, output = result_chunk_key(work.b1, 1, 0), input_object_key(output_file_id(work.b1))
    not_its_attempt = result_chunk_key(work.b1, 2, 0)
    await store.ask_ahead(work.b1, 1, [
        WantedObject(operation="get", key=work.input1), WantedObject(operation="put", key=own_chunk),
        WantedObject(operation="put", key=output), WantedObject(operation="put", key=not_its_attempt),
        WantedObject(operation="get", key=work.input2), WantedObject(operation="put", key=work.stranger)])
    assert set(store.granted) == {("get", work.input1), ("put", own_chunk), ("put", output)}
    await store.ask_ahead(work.b2, 1, [WantedObject(operation="get", key=work.input2)])  # bravo's: none granted
    assert ("get", work.input2) not in store.granted
    with working_on(work.b1):
        assert (await store.get_bytes(work.input1)).startswith(work.b1.encode())
        await store.put_bytes(own_chunk, b'{"chunk": 0}\n')
        await store.put_bytes(output, b"output\n")
        await brokered.auth.core.nc.flush()
        assert len(asked) == 2, "what was granted ahead is used without asking again"
        with pytest.raises(ObjectAccessRefused):
            await store.put_bytes(not_its_attempt, b"not my attempt\n")
        with pytest.raises(ObjectAccessRefused):
            await store.get_bytes(work.input2)
    assert await object_store.get_bytes(own_chunk) == b'{"chunk": 0}\n'


async def test_an_executor_is_refused_another_batchs_input_and_any_other_file(
        brokered: Brokered, work: Work, object_store: ObjectStore) -> None:
    await answering(brokered, work.book)
    store = BrokeredObjectStore(brokered.alpha.nc, "alpha", http_pool(), wait_s=5)
    with working_on(work.b1):
        for key in (work.input2, work.stranger):
            with pytest.raises(ObjectAccessRefused, match="is not an object of"):
                await store.get_bytes(key)
        with pytest.raises(ObjectAccessRefused):
            await store.put_bytes(work.stranger, b"overwritten\n")
        with pytest.raises(ObjectAccessRefused):
            await store.put_bytes(result_chunk_key(work.b1, 2, 0), b"not my attempt\n")
        with pytest.raises(ObjectAccessRefused):
            await store.list_keys(f"results/{work.b2}/")
    with working_on(work.b2), pytest.raises(ObjectAccessRefused, match="holds no live attempt"):
        await store.get_bytes(work.input2)
    assert await object_store.get_bytes(work.stranger) == b"someone else's data\n"


async def test_an_executor_cannot_ask_under_another_executors_name(brokered: Brokered, work: Work) -> None:
    """bravo runs b2, but alpha's connection may not publish on bravo's subject: the server drops the request."""
    await answering(brokered, work.book)
    posing = BrokeredObjectStore(brokered.alpha.nc, "bravo", http_pool(), wait_s=1)
    with working_on(work.b2), pytest.raises(ObjectBrokerUnavailable):
        await posing.get_bytes(work.input2)
    bravo = await broker.join(brokered.auth.executor_settings("bravo", OTHER_WORKER_KEY), asyncio.Event())
    assert bravo is not None
    try:
        with working_on(work.b2):
            store = BrokeredObjectStore(bravo.nc, "bravo", http_pool(), wait_s=5)
            assert (await store.get_bytes(work.input2)).startswith(work.b2.encode())
    finally:
        await bravo.close()


async def test_a_request_waits_for_a_leader_still_reading_the_log(brokered: Brokered, work: Work) -> None:
    caught_up = asyncio.Event()
    await answering(brokered, work.book, caught_up)
    store = BrokeredObjectStore(brokered.alpha.nc, "alpha", http_pool(), wait_s=10)
    asyncio.get_running_loop().call_later(1.0, caught_up.set)
    with working_on(work.b1):
        assert (await store.get_bytes(work.input1)).startswith(work.b1.encode())
