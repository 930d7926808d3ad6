"""A fleet of executors with different models and memory budgets: a large batch is split into shards that run on
several executors at once, a small model goes to the executor it fits best, an executor killed mid-shard loses
only its shard's lines in flight, and every line ends up exactly once."""

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx2
import pytest

from infra.embedded import free_port
from tests.e2e.conftest import ADMIN_KEY, RunningStack, start_stack, stop_stack
from tests.e2e.test_batch_lifecycle import accounted
from tests.factories import upload, wait_until_done

pytestmark = pytest.mark.e2e

CHAT = "smollm2-135m-instruct-q4_1"
EMBED = "smollm2-135m-embed"


@pytest.fixture(scope="module")
def fleet_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    running = start_stack(tmp_path_factory.mktemp("fleet") / "data", free_port(),
                          {"SHESHNAG_SCHEDULER_UNIT_MIN_LINES": "8", "SHESHNAG_SCHEDULER_UNIT_MAX_LINES": "8",
                           "SHESHNAG_EXECUTOR_CHUNK_LINES": "2"})
    yield running
    stop_stack(running)


def api(stack: RunningStack, method: str, path: str, **kwargs: object) -> dict:
    response = httpx2.request(method, f"http://127.0.0.1:{stack.port}{path}",
                              headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=30,
                              **kwargs)  # type: ignore[arg-type]
    assert response.status_code < 300, response.text
    return response.json()


def new_worker_key(stack: RunningStack, name: str) -> str:
    return str(api(stack, "POST", "/v1/provider/worker_keys", json={"name": name})["value"])


def start_executor(stack: RunningStack, executor_id: str, budget_mb: int, preload: list[str],
                   worker_key: str | None = None) -> subprocess.Popen:
    """One more executor process joining the stack's fleet with a worker key of its own, as a provider's would:
    no S3 credentials, its objects through URLs the scheduler signs."""
    worker_key = worker_key or new_worker_key(stack, executor_id)
    inherited = {name: value for name, value in os.environ.items() if not name.startswith("SHESHNAG_S3_")}
    env = dict(inherited, SHESHNAG_NATS_URL=stack.nats_url(executor_id, worker_key),
               SHESHNAG_EXECUTOR_EXECUTOR_ID=executor_id,
               SHESHNAG_EXECUTOR_WORKER_KEY=worker_key, SHESHNAG_EXECUTOR_MEMORY_BUDGET_MB=str(budget_mb),
               SHESHNAG_EXECUTOR_PRELOAD_MODELS=json.dumps(preload), SHESHNAG_METRICS_PORT="0",
               SHESHNAG_EXECUTOR_CHUNK_LINES="2",
               PYTHONUNBUFFERED="1")
    log = (stack.data_dir / "logs" / f"{executor_id}.log").open("ab")
    return subprocess.Popen([sys.executable, "-m", "services.executor"], env=env, stdout=log,
                            stderr=subprocess.STDOUT)


def executors(stack: RunningStack) -> dict[str, dict]:
    return {row["id"]: row for row in api(stack, "GET", "/v1/provider/executors")["data"]}


def wait_for(condition: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.3)
    raise TimeoutError(what)


@pytest.fixture(scope="module")
def fleet(fleet_stack: RunningStack) -> Iterator[dict[str, subprocess.Popen]]:
    processes = {
        "big-1": start_executor(fleet_stack, "big-1", budget_mb=4096, preload=[CHAT]),
        "small-1": start_executor(fleet_stack, "small-1", budget_mb=300, preload=[]),
    }
    wait_for(lambda: {"local-0", "big-1", "small-1"} <= {
        executor_id for executor_id, row in executors(fleet_stack).items() if row["health"] == "live"},
        120, "the fleet did not come online")
    yield processes
    for process in processes.values():
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(30)


def chat_lines(ids: list[str], max_tokens: int = 16) -> list[bytes]:
    return [json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                        "body": {"model": CHAT, "max_tokens": max_tokens,
                                 "messages": [{"role": "user", "content": f"Tell a story about {custom_id}."}]}},
                       ).encode() for custom_id in ids]


def lines_served(stack: RunningStack) -> dict[str, int]:
    return {executor_id: row["lines_served"] for executor_id, row in executors(stack).items()}


def test_a_large_batch_runs_as_shards_on_the_executors_that_fit_its_model(
        fleet_stack: RunningStack, fleet: dict[str, subprocess.Popen]) -> None:
    client = fleet_stack.client()
    before = lines_served(fleet_stack)
    ids = [f"shard-{i}" for i in range(24)]
    created = client.batches.create(input_file_id=upload(client, chat_lines(ids)), endpoint="/v1/chat/completions",
                                    completion_window="24h")
    batch, _ = wait_until_done(client, created.id, timeout_s=240)
    assert batch.status == "completed", batch.model_dump()
    accounted(client, batch, ids)
    served = {name: count - before.get(name, 0) for name, count in lines_served(fleet_stack).items()}
    # The chat model (400 MB) does not fit small-1's 300 MiB budget; the two that have it loaded split the batch.
    assert served["small-1"] == 0
    assert served["local-0"] > 0 and served["big-1"] > 0
    assert served["local-0"] + served["big-1"] == 24


def test_a_small_model_goes_to_the_executor_where_it_fits_tightest(
        fleet_stack: RunningStack, fleet: dict[str, subprocess.Popen]) -> None:
    client = fleet_stack.client()
    before = lines_served(fleet_stack)
    ids = [f"embed-{i}" for i in range(4)]
    lines = [json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings",
                         "body": {"model": EMBED, "input": f"text {custom_id}"}}).encode() for custom_id in ids]
    created = client.batches.create(input_file_id=upload(client, lines), endpoint="/v1/embeddings",
                                    completion_window="24h")
    batch, _ = wait_until_done(client, created.id, timeout_s=180)
    assert batch.status == "completed", batch.model_dump()
    accounted(client, batch, ids)
    served = {name: count - before.get(name, 0) for name, count in lines_served(fleet_stack).items()}
    assert served == {"local-0": 0, "big-1": 0, "small-1": 4}


@pytest.mark.timeout(900)
def test_an_executor_killed_mid_shard_loses_nothing_and_its_shard_finishes_elsewhere(
        fleet_stack: RunningStack, fleet: dict[str, subprocess.Popen]) -> None:
    client = fleet_stack.client()
    ids = [f"kill-{i}" for i in range(24)]
    created = client.batches.create(input_file_id=upload(client, chat_lines(ids, 32)), endpoint="/v1/chat/completions",
                                    completion_window="24h")
    before = lines_served(fleet_stack)["big-1"]
    # Generous: on 2 shared cores two chat executors decoding at once can be slow to commit their first chunk.
    wait_for(lambda: lines_served(fleet_stack)["big-1"] > before, 300, "big-1 committed nothing")
    fleet["big-1"].kill()
    batch, _ = wait_until_done(client, created.id, timeout_s=420)
    assert batch.status == "completed", batch.model_dump()
    accounted(client, batch, ids)
    wait_for(lambda: executors(fleet_stack)["big-1"]["health"] == "lost", 60, "big-1 was never declared lost")
