"""Chaos: SIGKILL a service (or the broker itself) while three owners' batches run interleaved, in units of a few
lines; every batch still ends with each of its lines exactly once."""

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import OpenAI

from infra.embedded import free_port
from tests.e2e.conftest import RunningStack, start_stack, stop_stack
from tests.e2e.sharing import SMALL_UNITS, user_client
from tests.e2e.test_batch_lifecycle import accounted
from tests.factories import long_lines, upload, wait_for_progress, wait_until_done

pytestmark = pytest.mark.e2e


LEADER_TTL_S = 5.0
"""The scheduler's lease (10 s by default): a SIGKILLed leader's successor (its own restart) waits it out before it
takes a decision: about half the scheduler case's run. Renewed every third of it, as in production."""


@pytest.fixture(scope="module")
def chaos_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    running = start_stack(tmp_path_factory.mktemp("chaos") / "data", free_port(),
                          {**SMALL_UNITS, "SHESHNAG_SCHEDULER_LEADER_TTL_S": str(LEADER_TTL_S)})
    yield running
    stop_stack(running)


@pytest.fixture(scope="module")
def owners(chaos_stack: RunningStack) -> list[OpenAI]:
    return [user_client(chaos_stack, f"chaos-{n}") for n in range(3)]


def kill(stack: RunningStack, name: str) -> int:
    pid = stack.service_pid(name)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while stack.service_pid(name) == pid and time.monotonic() < deadline:
        time.sleep(0.1)
    assert stack.service_pid(name) != pid, f"{name} was not restarted"
    return pid


@pytest.mark.parametrize("victim", ["executor", "scheduler", "ledger", "nats"])
def test_interleaved_batches_of_three_owners_survive_a_sigkill_mid_run_with_every_line_exactly_once(
        chaos_stack: RunningStack, owners: list[OpenAI], victim: str) -> None:
    ids = {n: [f"{victim}-{n}-{i}" for i in range(6)] for n in range(len(owners))}
    created = {n: client.batches.create(input_file_id=upload(client, long_lines(ids[n])),
                                        endpoint="/v1/chat/completions", completion_window="24h").id
               for n, client in enumerate(owners)}
    wait_for_progress(owners[0], created[0])
    kill(chaos_stack, victim)
    for n, client in enumerate(owners):
        client = client.with_options(max_retries=5)
        batch, _ = wait_until_done(client, created[n], timeout_s=240)
        assert batch.status == "completed", batch.model_dump()
        output, errors = accounted(client, batch, ids[n])
        assert errors == [] and len({line["custom_id"] for line in output}) == len(ids[n])
        assert all(json.dumps(line["response"]["body"]["usage"]) for line in output)
    up_log = Path(chaos_stack.data_dir.parent / f"up-{chaos_stack.port}.out").read_text()
    assert f"{'nats-server' if victim == 'nats' else victim} crashed with exit code -9" in up_log
