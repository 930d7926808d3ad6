"""The control plane on a 3-node JetStream cluster: every stream and bucket R3; a batch that runs through the
SIGKILL of the node leading EVENTS, one that runs whole while a node is down, and one that runs while the leading
scheduler is paused and its standby takes over, each end with every line exactly once and a ledger whose replay
equals live; a node, back, catches up."""

import asyncio
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from openai import OpenAI

from contracts.subjects import (
    EVENTS_STREAM,
    EXECUTORS_BUCKET,
    KEY_USAGE_BUCKET,
    LEADER_BUCKET,
    READ_MODEL_BUCKET,
    WORK_STREAM,
)
from infra.embedded import stop_process
from services.ledger import operator
from services.ledger.settings import LedgerSettings
from services.runtime.process.settings import ConnectionSettings
from tests.e2e.cluster import REPLICAS, ClusteredStack, clustered
from tests.factories import chat_line, custom_ids_seen, lost_and_duplicated, upload, wait_until_done

pytestmark = pytest.mark.e2e
__all__ = ["clustered"]

STREAMS = (EVENTS_STREAM, WORK_STREAM, *(f"KV_{bucket}" for bucket in (
    READ_MODEL_BUCKET, EXECUTORS_BUCKET, LEADER_BUCKET, KEY_USAGE_BUCKET)))


def wait_for_status(client: OpenAI, batch_id: str, wanted: frozenset[str], timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = client.batches.retrieve(batch_id).status
        if status in wanted:
            return status
        time.sleep(0.05)
    raise TimeoutError(f"batch {batch_id} never reached {sorted(wanted)}")


def caught_up(clustered: ClusteredStack, node: str, within_s: float = 60) -> None:
    """Until every node, `node` back among them, holds every stream and bucket up to date (the next test then starts
    on a whole cluster, not on one whose buckets are still catching up)."""
    deadline = time.monotonic() + within_s
    every_node = {each.name for each in clustered.cluster.nodes}
    for stream in STREAMS:
        while clustered.current_peers(stream) != every_node:
            assert time.monotonic() < deadline, f"{node} did not catch up with {stream} within {within_s}s"
            time.sleep(0.2)


def patient_client(clustered: ClusteredStack) -> OpenAI:
    """A client that retries through a broker's leader election (and a gateway's reconnect to another node): its
    503s ask for a retry after 1 s, so five retries waited about six seconds, less than a loaded machine's election."""
    return OpenAI(base_url=clustered.stack.base_url, api_key=clustered.stack.client().api_key, max_retries=15,
                  timeout=60)


def small_batch_runs_once(client: OpenAI, tag: str, timeout_s: float = 180) -> tuple[str, float]:
    """A 4-line batch from create to its end: its status and seconds taken, every line in its files once."""
    ids = [f"{tag}-{i}" for i in range(4)]
    started = time.monotonic()
    created = client.batches.create(
        input_file_id=upload(client, [chat_line(custom_id, f"Name {i + 2} colours.", max_tokens=8)
                                      for i, custom_id in enumerate(ids)]),
        endpoint="/v1/chat/completions", completion_window="24h")
    batch, _ = wait_until_done(client, created.id, timeout_s=timeout_s)
    assert batch.status == "completed", batch.model_dump()
    assert lost_and_duplicated(ids, custom_ids_seen(client, batch)) == (0, 0)
    return batch.status, time.monotonic() - started


def replay_equals_live(clustered: ClusteredStack) -> None:
    report = io.StringIO()
    settings = LedgerSettings(connection=ConnectionSettings(nats_url=clustered.cluster.core_urls()))
    assert asyncio.run(operator.replay(settings, report)) == 0, report.getvalue()


def test_every_stream_and_bucket_is_held_by_three_replicas(clustered: ClusteredStack) -> None:
    assert clustered.stream_replicas(STREAMS) == dict.fromkeys(STREAMS, REPLICAS)


def test_a_batch_survives_the_sigkill_of_the_node_leading_events_with_every_line_once_and_replay_equal_to_live(
        clustered: ClusteredStack) -> None:
    client = clustered.stack.client()
    ids = [f"leader-kill-{i}" for i in range(6)]
    created = client.batches.create(
        input_file_id=upload(client, [chat_line(custom_id, f"Count to {i + 3}.", max_tokens=8)
                                      for i, custom_id in enumerate(ids)]),
        endpoint="/v1/chat/completions", completion_window="24h")
    status_at_kill = wait_for_status(client, created.id, frozenset({"in_progress", "finalizing", "completed"}))
    leader = clustered.leader(EVENTS_STREAM)
    assert leader is not None
    killed_at = time.monotonic()
    clustered.cluster.kill(leader)

    elected = clustered.new_leader(EVENTS_STREAM, not_this=leader)
    elected_after_s = time.monotonic() - killed_at
    patient = OpenAI(base_url=clustered.stack.base_url, api_key=client.api_key, max_retries=5, timeout=60)
    batch, _ = wait_until_done(patient, created.id, timeout_s=90)
    done_after_s = time.monotonic() - killed_at
    lost, duplicated = lost_and_duplicated(ids, custom_ids_seen(patient, batch))
    print(f"\nkilled {leader} at {status_at_kill}; {elected} leads EVENTS after {elected_after_s:.1f}s; batch "
          f"{batch.status} {done_after_s:.1f}s after the kill; {lost} lines lost, {duplicated} duplicated")

    assert batch.status == "completed", batch.model_dump()
    assert (lost, duplicated) == (0, 0)
    replay_equals_live(clustered)

    clustered.cluster.start_node(leader)  # back on its ports and store: it rejoins as itself and catches up
    caught_up(clustered, leader)


def test_a_batch_runs_whole_while_one_node_is_down_and_the_node_catches_up_when_it_returns(
        clustered: ClusteredStack) -> None:
    """A node that is down before a batch is created and stays down until it ends: the other two keep a quorum of
    every R3 stream and bucket, so nothing waits for it; back, it catches up with what it missed."""
    down = next(node.name for node in clustered.cluster.nodes if node.name != clustered.leader(EVENTS_STREAM))
    clustered.cluster.kill(down)
    try:
        status, seconds = small_batch_runs_once(patient_client(clustered), "node-down")
        print(f"\n{down} down for the whole run: batch {status} in {seconds:.1f}s; 0 lines lost, 0 duplicated")
        replay_equals_live(clustered)
    finally:
        clustered.cluster.start_node(down)
    caught_up(clustered, down)


def environment_of(pid: int) -> dict[str, str]:
    """A process's environment as it was started (a standby scheduler is started with the leader's own)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(entry.decode().split("=", 1) for entry in raw if b"=" in entry)


def test_a_standby_scheduler_takes_over_from_a_paused_leader_and_the_batch_completes_once(
        clustered: ClusteredStack) -> None:
    stack = clustered.stack
    leader = stack.service_pid("scheduler")
    standby_log = stack.data_dir / "logs" / "scheduler-standby.log"
    with standby_log.open("ab") as out:
        standby = subprocess.Popen([sys.executable, "-m", "services.scheduler"], env=environment_of(leader),
                                   stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while "stands by" not in standby_log.read_text(errors="replace"):
            assert standby.poll() is None and time.monotonic() < deadline, standby_log.read_text()[-2000:]
            time.sleep(0.2)
        os.kill(leader, signal.SIGSTOP)  # a GC stall, a VM migration: alive, silent, still holding its lease
        try:
            status, seconds = small_batch_runs_once(patient_client(clustered), "standby")
        finally:
            os.kill(leader, signal.SIGCONT)  # back: it finds its lease gone and stands by
        print(f"\nleading scheduler paused: batch {status} in {seconds:.1f}s on the standby; 0 lost, 0 duplicated")
        assert "is the leader" in standby_log.read_text(errors="replace")
    finally:
        stop_process(standby, within_s=30)
    replay_equals_live(clustered)
