"""Many small units of one batch on one executor cost each their own lines, not the batch's (real broker, S3 server
and model): the batch's input is downloaded once and its log read once, for all of them; a unit resumes from the
chunks of its own lines only; one unit's attempt fenced stops that unit alone; an attempt joining the shared feed
sees every fact the log held when it joined, read directly or through the fact desk."""

import asyncio
import contextlib
import json
import secrets
from collections import Counter
from collections.abc import AsyncIterator, Callable

import pytest

from contracts.api.output_line import decode_chunk
from contracts.catalogue import Catalogue
from contracts.commands import RunBatch
from contracts.events.batch import (
    AttemptFailed,
    BatchAssigned,
    BatchCancelRequested,
    BatchCompleted,
    BatchProgressed,
    BatchStarted,
    ShardFinished,
    ShardLayout,
)
from contracts.events.envelope import Event
from contracts.events.registry import AnyEvent, decode_event
from contracts.subjects import batch_events, input_object_key, results_prefix
from contracts.terms import BatchTerms
from services.executor.adapters.desk import DeskBus, FactDesk
from services.executor.adapters.engines.base import Engine
from services.executor.adapters.engines.shelf import EngineShelf
from services.executor.adapters.log_reader import read_log
from services.executor.adapters.watch import WatchHub
from services.executor.attempt_run import AttemptRun
from services.executor.runner import BatchRunner
from services.executor.slots import SlotPool
from services.runtime.nats import eventlog
from services.runtime.nats.bus import EventBus
from services.runtime.storage.objectstore import ObjectStore
from tests.integration.desk_support import fact_desk, hold
from tests.integration.test_executor_lifecycle import CATALOGUE, CHAT, chat
from tests.support import batch_facts

EXECUTOR = "units-exec"


class Reads:
    """The real object store, telling what was read of it."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self.streamed: Counter[str] = Counter()
        self.got: list[str] = []
        self.listed: list[str] = []

    def iter_chunks(self, key: str) -> AsyncIterator[bytes]:
        self.streamed[key] += 1
        return self.store.iter_chunks(key)

    def iter_lines(self, key: str) -> AsyncIterator[bytes]:
        self.streamed[key] += 1
        return self.store.iter_lines(key)

    async def get_bytes(self, key: str) -> bytes:
        self.got.append(key)
        return await self.store.get_bytes(key)

    async def put_bytes(self, key: str, data: bytes, content_type: str = "application/jsonl") -> None:
        await self.store.put_bytes(key, data, content_type)

    async def list_keys(self, prefix: str) -> list[str]:
        self.listed.append(prefix)
        return await self.store.list_keys(prefix)


@pytest.fixture(scope="module")
async def engine() -> AsyncIterator[Engine]:
    model = Catalogue.from_toml(CATALOGUE).resolve(CHAT)
    assert model is not None
    shelf = EngineShelf("llamacpp", 2, [model])
    loaded = await shelf.get(CHAT)
    assert loaded is not None
    yield loaded
    await shelf.unload_all()


async def units(bus: EventBus, store: ObjectStore, lines: list[dict[str, object]], span: int) -> list[RunBatch]:
    """A batch of `lines` in units of `span` lines, attempt n + 1 for unit n, each assigned in the log."""
    batch_id = f"batch_{secrets.token_hex(6)}"
    key = input_object_key(f"file-in-{batch_id}")
    rows = [{"custom_id": f"line-{n}", "method": "POST", "url": "/v1/chat/completions", "body": {"model": CHAT, **body}}
            for n, body in enumerate(lines)]
    await store.put_bytes(key, b"".join(json.dumps(row).encode() + b"\n" for row in rows))
    layout = ShardLayout(shards=-(-len(lines) // span), span=span)
    terms = BatchTerms(owner_key_id="key_owner", endpoint="/v1/chat/completions", input_object_key=key)
    commands = [RunBatch(batch_id=batch_id, executor_id=EXECUTOR, attempt=unit + 1, lease_token=f"lease-{unit + 1}",
                         terms=terms, model=CHAT, total_lines=len(lines), shard=unit, layout=layout)
                for unit in range(layout.shards)]
    for command in commands:
        await bus.publish(BatchAssigned(aggregate_id=batch_id, executor_id=EXECUTOR, attempt=command.attempt,
                                        lease_token=command.lease_token, shard=command.shard, shards=layout.shards,
                                        shard_span=layout.span))
    return commands


def shards_finished(count: int) -> Callable[[AnyEvent], bool]:
    finished: set[int] = set()

    def until(fact: AnyEvent) -> bool:
        if isinstance(fact, ShardFinished):
            finished.add(fact.shard)
        return len(finished) == count

    return until


async def committed_lines(store: ObjectStore, facts: list[AnyEvent]) -> Counter[int]:
    """How often each input line lies in an announced chunk."""
    lines: Counter[int] = Counter()
    for key in [fact.chunk_key for fact in facts if isinstance(fact, BatchProgressed)]:
        lines.update(line.line for line in decode_chunk(await store.get_bytes(key)))
    return lines


async def test_units_of_one_batch_download_its_input_once_read_its_log_once_and_commit_every_line_once(
    bus: EventBus, object_store: ObjectStore, engine: Engine,
) -> None:
    commands = await units(bus, object_store, [chat(n, max_tokens=1) for n in range(40)], span=8)
    reads = Reads(object_store)
    runner = BatchRunner(bus, reads, EXECUTOR, chunk_lines=3)
    await asyncio.gather(*(runner.run(command, engine) for command in commands))

    facts = await batch_facts(bus, commands[0].batch_id, shards_finished(len(commands)))
    assert await committed_lines(object_store, facts) == Counter(range(1, 41)), "every line once"
    assert reads.streamed == {commands[0].terms.input_object_key: 1}, "the input was downloaded once, for every unit"
    assert runner.watches.opened == 1, "one read of the batch's log served every unit"
    assert reads.got == [], "a first run reads no chunk back"

    # A unit delivered again reads back its own chunks, none of its siblings'.
    again = commands[2]
    await runner.run(again, engine)
    own = {fact.chunk_key for fact in facts if isinstance(fact, BatchProgressed) and fact.shard == again.shard}
    assert set(reads.got) == own and len(reads.got) == len(own)
    assert reads.streamed == {again.terms.input_object_key: 1} and runner.watches.opened == 1, "both still in hand"
    await runner.close()


async def test_one_unit_fenced_stops_alone_while_its_siblings_on_the_same_feed_finish(
    bus: EventBus, object_store: ObjectStore, engine: Engine,
) -> None:
    commands = await units(bus, object_store, [chat(n, max_tokens=8) for n in range(12)], span=4)
    runner = BatchRunner(bus, object_store, EXECUTOR, chunk_lines=1)
    running = [asyncio.create_task(runner.run(command, engine)) for command in commands]
    victim = commands[1]
    await batch_facts(bus, victim.batch_id,
                      lambda fact: isinstance(fact, BatchProgressed) and fact.attempt == victim.attempt)
    fenced = await bus.publish(AttemptFailed(aggregate_id=victim.batch_id, attempt=victim.attempt,
                                             executor_id=EXECUTOR, code="executor_lost", reason="missed heartbeats"))
    await asyncio.wait_for(asyncio.gather(*running), 120)

    facts = await batch_facts(bus, victim.batch_id, shards_finished(2))
    finished = {fact.shard for fact in facts if isinstance(fact, ShardFinished)}
    assert finished == {0, 2}, "the siblings finished, the fenced unit did not"
    sequences = await _sequences(bus, victim.batch_id)
    late = [fact for sequence, fact in sequences if sequence > fenced and getattr(fact, "attempt", None) == 2
            and not isinstance(fact, AttemptFailed)]
    assert late == [], "the fenced attempt stated nothing after its fence"
    lines = await committed_lines(object_store, facts)
    assert all(lines[line] == 1 for line in [*range(1, 5), *range(9, 13)]) and max(lines.values()) == 1
    await runner.close()


async def _sequences(bus: EventBus, batch_id: str) -> list[tuple[int, AnyEvent]]:
    return await read_log(bus, batch_id)


@contextlib.asynccontextmanager
async def reading_as(kind: str, bus: EventBus, command: RunBatch) -> AsyncIterator[EventBus]:
    """The bus an executor reads the log through: directly, or the fact desk (which must know what it holds)."""
    if kind == "direct":
        yield bus
        return
    async with fact_desk(bus) as book:
        hold(book, command)
        desk_bus = DeskBus(bus.nc, "units-desk")
        desk_bus.desk = FactDesk(bus.nc, command.executor_id)
        yield desk_bus


@pytest.mark.parametrize("kind", ["direct", "desk"])
async def test_an_attempt_joining_an_open_feed_sees_every_fact_the_log_held_when_it_joined(
    bus: EventBus, object_store: ObjectStore, kind: str,
) -> None:
    first, second, *_ = await units(bus, object_store, [chat(n) for n in range(12)], span=4)
    async with reading_as(kind, bus, first) as reading:
        hub = WatchHub(reading, linger_s=0.3)
        async with hub.watch(first.batch_id, first.attempt) as one:
            await bus.publish(BatchCancelRequested(aggregate_id=first.batch_id, requested_by_key_id="key_owner"))
            async with hub.watch(second.batch_id, second.attempt) as two:
                assert two.stop_reason() == "cancelled" and two.stopping.is_set(), "it read the log to its end"
                assert two.feed is one.feed and hub.opened == 1
        assert first.batch_id in hub.feeds, "the feed lingers for the batch's next unit"
        await asyncio.sleep(0.6)
        assert hub.feeds == {}, "and closes after"
        async with hub.watch(first.batch_id, 3) as three:
            assert three.log.cancel_requested and hub.opened == 2
        await hub.close()


@pytest.mark.parametrize("kind", ["direct", "desk"])
async def test_a_feed_closes_at_once_when_its_batch_ended_no_unit_of_it_comes_again(
    bus: EventBus, object_store: ObjectStore, kind: str,
) -> None:
    first, *_ = await units(bus, object_store, [chat(n) for n in range(8)], span=4)
    async with reading_as(kind, bus, first) as reading:
        hub = WatchHub(reading, linger_s=60.0)
        async with hub.watch(first.batch_id, first.attempt) as one:
            one.feed.ended_here = True  # this attempt published the batch's terminal fact
        assert hub.feeds == {}, "no linger (and no reads of the log meanwhile) for a batch that ended"
        async with hub.watch(first.batch_id, first.attempt) as again:
            assert again.feed is not one.feed and hub.opened == 2, "a late delivery reads the log afresh"
        await hub.close()


async def test_a_unit_waiting_for_the_engines_slots_is_started_only_once_its_first_line_has_one(
    bus: EventBus, object_store: ObjectStore, engine: Engine,
) -> None:
    """An executor runs several attempts at once on its slots: one waiting for the slots of others has run nothing,
    so it is not `started` (the scheduler holds only a started attempt's lost executor against its lines)."""
    commands = await units(bus, object_store, [chat(n, max_tokens=1) for n in range(4)], span=2)
    runner = BatchRunner(bus, object_store, EXECUTOR, chunk_lines=2)
    pool = runner.pools.setdefault(engine, SlotPool(engine.slots))
    never = asyncio.Event()
    others = [await pool.take("another owner", never) for _ in range(engine.slots)]  # every slot busy elsewhere
    running = [asyncio.create_task(runner.run(command, engine)) for command in commands]
    for _ in range(1200):  # until each attempt has its first line in the queue
        if pool.waiting >= len(commands):
            break
        await asyncio.sleep(0.05)

    # An attempt's command was taken (and anything stated on taking it acknowledged) before its first line queued.
    stated = [decode_event(fact.data).type async for fact in eventlog.read(bus, batch_events(commands[0].batch_id))]
    assert "batch.started" not in stated, "started while waiting for a slot"

    for slot in others:
        assert slot is not None
        slot.give_back()
    await asyncio.wait_for(asyncio.gather(*running), 120)
    facts = await batch_facts(bus, commands[0].batch_id, shards_finished(len(commands)))
    for command in commands:
        own = [type(fact) for fact in facts if getattr(fact, "attempt", None) == command.attempt
               and not isinstance(fact, BatchAssigned)]
        assert own[0] is BatchStarted and own.count(BatchStarted) == 1, own
    await runner.close()


async def test_a_first_delivery_of_a_one_unit_batch_lists_nothing_and_finalizes_from_the_chunks_it_holds(
    bus: EventBus, object_store: ObjectStore, engine: Engine,
) -> None:
    [command] = await units(bus, object_store, [chat(n, max_tokens=1) for n in range(5)], span=8)
    reads = Reads(object_store)
    runner = BatchRunner(bus, reads, EXECUTOR, chunk_lines=2)
    await runner.run(command, engine)

    facts = await batch_facts(bus, command.batch_id, lambda fact: isinstance(fact, BatchCompleted))
    assert reads.listed == [], "no earlier delivery could have written a chunk, and there are no rejections"
    assert not [key for key in reads.got if key.startswith(results_prefix(command.batch_id))], \
        "the chunks it committed are not read back to assemble the output"
    completed = facts[-1]
    assert isinstance(completed, BatchCompleted) and completed.output_file_id is not None
    output = await object_store.get_bytes(input_object_key(completed.output_file_id))
    assert sorted(json.loads(row)["custom_id"] for row in output.splitlines()) == [f"line-{n}" for n in range(5)]
    await runner.close()


async def test_a_redelivered_attempt_looks_for_the_chunks_an_earlier_delivery_wrote(
    bus: EventBus, object_store: ObjectStore, engine: Engine,
) -> None:
    [command] = await units(bus, object_store, [chat(n, max_tokens=1) for n in range(3)], span=8)
    # An earlier delivery started (and may have written a chunk before it died, unannounced).
    await bus.publish(BatchStarted(aggregate_id=command.batch_id, executor_id=EXECUTOR, attempt=command.attempt,
                                   engine=engine.name, engine_version=engine.version))
    reads = Reads(object_store)
    runner = BatchRunner(bus, reads, EXECUTOR, chunk_lines=2)
    await runner.run(command, engine)
    await batch_facts(bus, command.batch_id, lambda fact: isinstance(fact, BatchCompleted))
    assert any(prefix.startswith(results_prefix(command.batch_id)) for prefix in reads.listed)
    await runner.close()


async def test_an_attempts_first_line_runs_while_its_start_is_stated_and_its_first_chunk_waits_for_it(
    bus: EventBus, object_store: ObjectStore, engine: Engine, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No round trip to the log delays a batch's first line: `started` is stated while the line runs, and still
    goes out before anything the attempt commits."""
    [command] = await units(bus, object_store, [chat(n, max_tokens=1) for n in range(3)], span=8)
    in_engine_at_start: list[int] = []
    publish = AttemptRun.publish

    async def stating(self: AttemptRun, *events: Event) -> bool:
        if any(isinstance(event, BatchStarted) for event in events):
            for _ in range(400):  # the first line reaches the engine without waiting for this publish
                if self.in_engine:
                    break
                await asyncio.sleep(0.025)
            in_engine_at_start.append(len(self.in_engine))
        return await publish(self, *events)

    monkeypatch.setattr(AttemptRun, "publish", stating)
    runner = BatchRunner(bus, object_store, EXECUTOR, chunk_lines=1)
    await runner.run(command, engine)
    facts = await batch_facts(bus, command.batch_id, lambda fact: isinstance(fact, BatchCompleted))
    assert in_engine_at_start and in_engine_at_start[0] > 0, "the first line waited for `started` to be stored"
    own = [type(fact) for fact in facts if getattr(fact, "attempt", None) == command.attempt
           and not isinstance(fact, BatchAssigned)]
    assert own[0] is BatchStarted and own.count(BatchStarted) == 1 and own.count(BatchProgressed) == 3, own
    await runner.close()


async def test_an_attempt_whose_start_is_refused_stops_its_lines_and_commits_nothing(
    bus: EventBus, object_store: ObjectStore, engine: Engine, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its lease was lost before `started` could be stated (another attempt moved the fence): the lines it had begun
    are stopped and nothing of theirs is written or stated."""
    [command] = await units(bus, object_store, [chat(n, max_tokens=64) for n in range(4)], span=8)
    publish = AttemptRun.publish
    answers: list[int] = []
    refused = asyncio.Event()
    """Lines reach the engine only once the start is refused: a line not stopped then would be answered."""

    async def refusing(self: AttemptRun, *events: Event) -> bool:
        if any(isinstance(event, BatchStarted) for event in events):
            for _ in range(400):
                if self.in_engine:
                    break
                await asyncio.sleep(0.025)
            asyncio.get_running_loop().call_soon(refused.set)
            return False  # as when the attempt's fence moved
        return await publish(self, *events)

    run_line = type(engine).run

    async def counted(self: Engine, endpoint: str, body: dict[str, object]) -> object:
        await refused.wait()
        reply = await run_line(self, endpoint, body)
        answers.append(1)
        return reply

    monkeypatch.setattr(AttemptRun, "publish", refusing)
    monkeypatch.setattr(type(engine), "run", counted)
    runner = BatchRunner(bus, object_store, EXECUTOR, chunk_lines=1)
    await asyncio.wait_for(runner.run(command, engine), 120)
    monkeypatch.undo()

    stated = [decode_event(fact.data) async for fact in eventlog.read(bus, batch_events(command.batch_id))]
    assert [type(fact) for fact in stated] == [BatchAssigned], "nothing stated after the assignment"
    assert await object_store.list_keys(results_prefix(command.batch_id)) == [], "no chunk written"
    assert answers == [], "every line begun was stopped before its answer"
    await runner.close()
