"""A shared fleet: batches of several owners are handed out line by line in small units over every executor. A
small batch of one user does not wait for another user's large one; an executor that joins mid-run takes part, one
SIGKILLed loses only its units in flight, one paused past its lease has its late results refused — and every line
of every batch ends up in its files exactly once, with request counts and usage counted once."""

import os
import signal
from collections.abc import Iterator

import pytest
from openai import OpenAI
from openai.types import Batch

from contracts.lifecycle import TERMINAL
from infra.embedded import free_port
from tests.e2e.conftest import RunningStack, start_stack, stop_stack
from tests.e2e.sharing import SMALL_UNITS, user_client
from tests.e2e.test_batch_lifecycle import accounted
from tests.e2e.test_fleet import CHAT, chat_lines, executors, lines_served, start_executor, wait_for
from tests.factories import upload, wait_until_done

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def shared_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    running = start_stack(tmp_path_factory.mktemp("shared") / "data", free_port(), SMALL_UNITS)
    wait_for(lambda: executors(running).get("local-0", {}).get("health") == "live", 60, "local-0 did not come up")
    yield running
    stop_stack(running)


def create(client: OpenAI, ids: list[str], max_tokens: int) -> str:
    return client.batches.create(input_file_id=upload(client, chat_lines(ids, max_tokens)),
                                 endpoint="/v1/chat/completions", completion_window="24h").id


def counted_once(client: OpenAI, batch: Batch, ids: list[str]) -> None:
    """Completed, every line once in its output, and the batch's counts and usage are those of the output file."""
    assert batch.status == "completed", batch.model_dump()
    output, errors = accounted(client, batch, ids)
    assert errors == []
    usages = [line["response"]["body"]["usage"] for line in output]
    assert batch.usage is not None
    assert batch.usage.input_tokens == sum(usage["prompt_tokens"] for usage in usages) > 0
    assert batch.usage.output_tokens == sum(usage["completion_tokens"] for usage in usages) > 0


def served_since(stack: RunningStack, before: dict[str, int]) -> dict[str, int]:
    return {executor_id: count - before.get(executor_id, 0) for executor_id, count in lines_served(stack).items()}


def any_committed(clients: dict[str, OpenAI], batches: dict[str, str]) -> bool:
    retrieved = (clients[user].batches.retrieve(batch_id) for user, batch_id in batches.items())
    return any(batch.request_counts is not None and batch.request_counts.completed > 0 for batch in retrieved)


def any_open(clients: dict[str, OpenAI], batches: dict[str, str]) -> bool:
    return any(clients[user].batches.retrieve(batch_id).status not in TERMINAL for user, batch_id in batches.items())


@pytest.mark.timeout(300)
def test_a_small_batch_of_one_user_completes_while_another_users_large_batch_still_runs(
        shared_stack: RunningStack) -> None:
    large_owner, small_owner = user_client(shared_stack, "dana"), user_client(shared_stack, "erin")
    large_ids, small_ids = [f"large-{i}" for i in range(80)], [f"small-{i}" for i in range(3)]
    large = create(large_owner, large_ids, max_tokens=8)
    wait_for(lambda: any_committed({"dana": large_owner}, {"dana": large}), 60, "the large batch did not start")
    small = create(small_owner, small_ids, max_tokens=8)

    small_batch, _ = wait_until_done(small_owner, small, timeout_s=90)
    large_then = large_owner.batches.retrieve(large)
    counted_once(small_owner, small_batch, small_ids)
    assert large_then.status == "in_progress", large_then.model_dump()
    assert large_then.request_counts is not None and large_then.request_counts.completed < len(large_ids)
    large_batch, _ = wait_until_done(large_owner, large, timeout_s=240)
    counted_once(large_owner, large_batch, large_ids)


@pytest.mark.timeout(360)
def test_three_owners_batches_on_a_changing_fleet_end_with_every_line_once_and_no_late_result_counted(
        shared_stack: RunningStack) -> None:
    clients = {user: user_client(shared_stack, user) for user in ("alice", "bob", "carol")}
    served_before = lines_served(shared_stack)
    ids = {user: [f"{user}-{i}" for i in range(24)] for user in clients}
    batches = {user: create(client, ids[user], max_tokens=8) for user, client in clients.items()}
    wait_for(lambda: any_committed(clients, batches), 60, "no batch started")

    # local-0 stalls with units in hand (a GC pause, a VM migration) past its lease; meanwhile an executor joins
    # mid-run, takes the units still pending and is SIGKILLed with some of them in flight.
    local = shared_stack.service_pid("executor")
    os.kill(local, signal.SIGSTOP)
    joiner = None
    try:
        joiner = start_executor(shared_stack, "late-1", budget_mb=4096, preload=[CHAT])
        wait_for(lambda: lines_served(shared_stack).get("late-1", 0) > 0, 90, "late-1 ran no unit")
        joiner.kill()
        assert any_open(clients, batches), "every batch ended before the kill: nothing was in flight"
        wait_for(lambda: executors(shared_stack)["local-0"]["health"] == "lost", 60, "local-0 was never lost")
    finally:
        os.kill(local, signal.SIGCONT)  # its late results now arrive, and must be refused
        if joiner is not None:
            joiner.kill()
            joiner.wait()

    for user, client in clients.items():
        batch, _ = wait_until_done(client, batches[user], timeout_s=240)
        counted_once(client, batch, ids[user])
    # Committed once across the fleet too: what the executors made durable adds up to the lines, no more.
    total = sum(map(len, ids.values()))
    wait_for(lambda: sum(served_since(shared_stack, served_before).values()) >= total, 15, "lines unserved")
    served = served_since(shared_stack, served_before)
    assert sum(served.values()) == total and served["late-1"] > 0, served
    assert executors(shared_stack)["late-1"]["health"] == "lost"
