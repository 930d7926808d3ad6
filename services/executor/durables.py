"""An executor's two durables on WORK, its run and its finalize commands: names, filters and delivery policy. The
scheduler makes them when it accepts the executor's registration (an admitted executor may only pull from and ack
them: one that made its own could make them under ids it never registers, or in a shape that locks their owner out);
an executor on a broker without admissions makes its own."""

from contracts.commands import FinalizeBatch, RunBatch
from contracts.events.executor import GUEST_ATTEMPTS
from contracts.subjects import WORK_STREAM, executor_durable, executor_finalize_durable, finalize_command, run_command
from services.runtime.nats.bus import ConsumerPolicy
from services.runtime.nats.delivery import Durable

FINALIZE_DELIVERIES = 30
"""Tries of one finalize command (backoff up to 10 s between them: about 4 minutes) before its batch fails."""
FINALIZE_PENDING = 4096
RUN_SPARE = 3
"""Run commands out at once beyond twice the attempts the executor runs together (its own, and as many a crashed
predecessor may still hold until their ack wait ends): those must not block the retries the scheduler sends after
fencing them (redelivered, a fenced one is dismissed at once)."""


def run_workers(parallel_attempts: int) -> int:
    """Run commands handled at once: the attempts the scheduler may give it (its guest places too), as many again for
    the commands a killed predecessor held (pending until their ack wait ends), and the spares."""
    return 2 * (max(parallel_attempts, 1) + GUEST_ATTEMPTS) + RUN_SPARE


def executor_durables(executor_id: str, ack_wait_s: float, max_deliver: int,
                      parallel_attempts: int) -> tuple[Durable, Durable]:
    """(runs, finalizes). `max_deliver` deliveries of a run command before its attempt fails; every run command out
    is handled at once (one fetched that no worker took would lose its lease while it waits). A finalize command
    that keeps failing is given up (its batch fails) after bounded tries, and many may wait (on a running attempt) at
    once, so one user's batches cannot hold every place."""
    runs = Durable(RunBatch, WORK_STREAM, executor_durable(executor_id), run_command(executor_id),
                   ConsumerPolicy(ack_wait_s=ack_wait_s, max_deliver=max_deliver,
                                  max_ack_pending=run_workers(parallel_attempts)))
    finals = Durable(FinalizeBatch, WORK_STREAM, executor_finalize_durable(executor_id), finalize_command(executor_id),
                     ConsumerPolicy(ack_wait_s=ack_wait_s, max_deliver=FINALIZE_DELIVERIES,
                                    max_ack_pending=FINALIZE_PENDING))
    return runs, finals
