"""One executor runs several attempts at once through one pool of engine slots, fair between owners: a small batch
of one user is not queued behind a long batch of another on the same executor (real broker, S3 server and model)."""

from pathlib import Path

from contracts.commands import FinalizeBatch
from contracts.events.batch import BatchProgressed, BatchStarted, ShardFinished
from contracts.events.registry import AnyEvent
from services.executor.settings import ExecutorSettings
from services.runtime.nats.bus import EventBus
from services.runtime.process.settings import ConnectionSettings
from services.runtime.storage.objectstore import ObjectStore
from tests.batch_invariant import check_invariant
from tests.integration.test_executor_lifecycle import (
    CATALOGUE,
    CHAT,
    all_facts,
    chat,
    ended,
    executor,
    files_of,
    new_batch,
    run_as_shards,
)
from tests.integration.test_executor_run import running_executor
from tests.support import batch_facts

__all__ = ["executor"]  # the fixture: an executor of the test's own, two engine slots
LONG_LINES = 12


async def test_a_one_line_batch_sent_after_a_long_one_of_another_owner_completes_while_the_long_one_runs(
    bus: EventBus, object_store: ObjectStore, executor: ExecutorSettings,
) -> None:
    long = (await new_batch(object_store, executor, "/v1/chat/completions", CHAT,
                            [chat(n, max_tokens=48) for n in range(LONG_LINES)])).model_copy(
        update={"owner_key_id": "key_big"})
    small = (await new_batch(object_store, executor, "/v1/chat/completions", CHAT, [chat(1)])).model_copy(
        update={"owner_key_id": "key_small"})
    await bus.send(long)
    await batch_facts(bus, long.batch_id, lambda fact: fact.type == "batch.progressed")  # both slots are its own
    await bus.send(small)

    small_facts = await batch_facts(bus, small.batch_id, ended)
    assert small_facts[-1].type == "batch.completed"
    long_so_far = await all_facts(bus, long.batch_id)
    assert not any(ended(fact) for fact in long_so_far), "the small batch waited for the long one"
    committed = sum(fact.completed + fact.failed for fact in long_so_far if fact.type == "batch.progressed")
    assert committed < LONG_LINES

    long_facts = await batch_facts(bus, long.batch_id, ended, timeout_s=120.0)
    completed = long_facts[-1]
    assert completed.type == "batch.completed" and (completed.completed, completed.failed) == (LONG_LINES, 0)
    check_invariant(LONG_LINES, LONG_LINES, 0, *await files_of(object_store, long.batch_id))
    check_invariant(1, 1, 0, *await files_of(object_store, small.batch_id))


async def test_an_expiry_finalize_stops_every_shard_of_the_batch_running_on_the_executor(
    bus: EventBus, object_store: ObjectStore, executor: ExecutorSettings,
) -> None:
    """The scheduler's FinalizeBatch reaches the executor while two shards of the batch run on it at once: each
    attempt stops (no new line starts) and reports its shard stopped."""
    lines = 16
    whole = await new_batch(object_store, executor, "/v1/chat/completions", CHAT,
                            [chat(n, max_tokens=48) for n in range(lines)])
    await run_as_shards(bus, whole, 2)
    started: set[int] = set()

    def both_started(fact: AnyEvent) -> bool:
        if isinstance(fact, BatchStarted):
            started.add(fact.attempt)
        return started == {1, 2}

    await batch_facts(bus, whole.batch_id, both_started)
    await bus.send(FinalizeBatch(batch_id=whole.batch_id, executor_id=executor.executor_id, reason="expired",
                                 terms=whole.terms))
    finished: dict[int, ShardFinished] = {}

    def both_finished(fact: AnyEvent) -> bool:
        if isinstance(fact, ShardFinished):
            finished[fact.shard] = fact
        return len(finished) == 2

    facts = await batch_facts(bus, whole.batch_id, both_finished)
    assert all(fact.stopped for fact in finished.values()), "each attempt was told to stop"
    committed = sum(fact.completed + fact.failed for fact in facts if isinstance(fact, BatchProgressed))
    assert committed < lines, "the expiry should land before every line ran"


async def test_a_finished_line_is_committed_within_the_wait_while_its_neighbour_still_runs(
    bus: EventBus, object_store: ObjectStore, connection: ConnectionSettings, tmp_path: Path,
) -> None:
    """Progress moves by the clock, not only when the next line finishes: a short line beside a long one (the two
    slots) commits alone once it has waited `chunk_max_wait_s`, long before the long line ends. The wait is short
    here (0.3 s) against a line of a few hundred tokens, so a fast machine does not finish both inside it."""
    async with running_executor(connection, tmp_path, CATALOGUE, chunk_max_wait_s=0.3) as executor:
        command = await new_batch(object_store, executor, "/v1/chat/completions", CHAT,
                                  [chat(1, max_tokens=1), chat(2, max_tokens=700)])
        await bus.send(command)
        facts = await batch_facts(bus, command.batch_id, ended, timeout_s=120.0)
    progressed = [fact for fact in facts if isinstance(fact, BatchProgressed)]
    assert [(fact.completed, fact.failed) for fact in progressed] == [(1, 0), (2, 0)]
    assert facts[-1].type == "batch.completed"
