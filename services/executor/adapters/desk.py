"""The executor's way into the event log under NATS authorization (it may not touch EVENTS): the leading scheduler's
fact desk stores its facts, fenced atomically with the write, and shows it its batches' facts (`DeskBus`)."""

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

import nats.errors
from nats.aio.client import Client
from pydantic import ValidationError

from contracts.events.envelope import Event
from contracts.events.registry import AnyEvent, decode_event
from contracts.fact_desk import FACTS_PER_SUBMISSION, FactReceipt, FactSubmission, FenceCondition, LogPage, LogRead
from contracts.subjects import fact_submissions, log_reads
from services.runtime.nats.bus import EventBus, Fence, FenceMoved
from services.runtime.process.telemetry import inject_headers

log = logging.getLogger(__name__)

ANSWER_TIMEOUT_S = 5.0
RETRY_EVERY_S = 0.5
DESK_WAIT_S = 60.0
"""How long a fact or a read waits for a scheduler to answer (none leads, or a new leader is catching up)."""

Sequenced = tuple[int, AnyEvent]
Answer = TypeVar("Answer", FactReceipt, LogPage)
Judged = TypeVar("Judged")


def decoded_facts(raw: Iterable[tuple[int, bytes]]) -> list[Sequenced]:
    """The facts of (stream sequence, bytes) pairs; a fact of a kind newer than this executor knows is skipped."""
    facts: list[Sequenced] = []
    for sequence, data in raw:
        try:
            facts.append((sequence, decode_event(data)))
        except ValidationError:
            log.debug("skipping an undecodable fact at sequence %d", sequence)
    return facts


class FactRefused(PermissionError):
    """The desk refused the fact or read: this executor is not entitled to it."""


class DeskUnavailable(ConnectionError):
    """No scheduler answered (or could judge) within the wait."""


class FactDesk:
    def __init__(self, nc: Client, executor_id: str, wait_s: float = DESK_WAIT_S) -> None:
        self.nc = nc
        self.submissions = fact_submissions(executor_id)
        self.reads = log_reads(executor_id)
        self.wait_s = wait_s

    async def submit(self, event: Event, *then: Event, fence: Fence | None = None) -> int:
        """Store `event`, then each of `then`, in one request: the last one's stream sequence; FenceMoved as it says."""
        submission = FactSubmission(event=event.model_dump_json(), then=[fact.model_dump_json() for fact in then],
                                    fence=FenceCondition(subject=fence.subject, sequence=fence.sequence)
                                    if fence else None)
        receipt = await self._ask(self.submissions, submission.model_dump_json(), FactReceipt,
                                  ", ".join(f"{fact.type} of {fact.aggregate_id}" for fact in (event, *then)))
        if receipt.status == "fence_moved":
            raise FenceMoved(fence or Fence("", 0), receipt.sequence)
        return receipt.sequence

    async def read(self, batch_id: str, after: int) -> tuple[list[Sequenced], int, bool]:
        """The batch's execution facts after sequence `after`: (facts, the last sequence read, whether more follow)."""
        page = await self._ask(self.reads, LogRead(batch_id=batch_id, after=after).model_dump_json(), LogPage,
                               f"the log of {batch_id}")
        facts = decoded_facts((fact.sequence, fact.event.encode()) for fact in page.facts if fact.event)
        return facts, max([after, *(fact.sequence for fact in page.facts)]), page.more

    async def _ask(self, subject: str, payload: str, answer_type: type[Answer], what: str) -> Answer:
        def judged(data: bytes) -> tuple[Answer | None, str]:
            answer = answer_type.model_validate_json(data)
            if answer.status == "refused":
                raise FactRefused(f"{what}: {answer.reason}")
            return (None, answer.reason or "the desk cannot judge yet") if answer.status == "retry" else (answer, "")

        # The fact joins the trace the executor is in: the desk publishes it under this context.
        return await ask_until_answered(self.nc, subject, payload.encode(), judged, self.wait_s, what,
                                        DeskUnavailable, inject_headers({}))


async def ask_until_answered(nc: Client, subject: str, payload: bytes,
                             judged: Callable[[bytes], tuple[Judged | None, str]], wait_s: float, what: str,
                             unavailable: type[ConnectionError], headers: dict[str, str] | None = None) -> Judged:
    """The answer `judged` takes from a reply on `subject`, asked every RETRY_EVERY_S; `unavailable` past `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            reply = await nc.request(subject, payload, timeout=ANSWER_TIMEOUT_S, headers=headers)
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
            why = "no scheduler answers"
        else:
            answer, why = judged(reply.data)
            if answer is not None:
                return answer
        if time.monotonic() > deadline:
            raise unavailable(f"{what}: {why} (waited {wait_s:.0f}s)")
        await asyncio.sleep(RETRY_EVERY_S)


class DeskBus(EventBus):
    """An executor's bus under authorization: every fact goes through the desk."""

    desk: FactDesk

    async def publish(self, event: Event, fence: Fence | None = None) -> int:
        return await self.desk.submit(event, fence=fence)


async def publish_in_order(bus: EventBus, events: Sequence[Event], fence: Fence | None = None) -> int:
    """Publish `events` in order under `fence` (one desk request under authorization): the last one's sequence."""
    if isinstance(bus, DeskBus) and len(events) <= FACTS_PER_SUBMISSION:
        return await bus.desk.submit(*events, fence=fence)
    sequence = 0
    for event in events:
        sequence = await bus.publish(event, fence)
    return sequence
