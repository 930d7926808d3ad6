"""The fact desk: executors' only way into the event log. It stores the facts they may state and shows them their
batches' execution facts, judged on the leader's caught-up book (`entitlements`). Requests arrive on subjects only the
asking executor may publish to (`fact_submissions`, `log_reads`), so the subject says who asks."""

import asyncio
import logging
import time
from dataclasses import dataclass, field

import nats.errors
import nats.js.errors
from minio.error import S3Error
from pydantic import ValidationError

from contracts.catalogue import Catalogue
from contracts.events.file import FileStored
from contracts.events.registry import decode_event
from contracts.fact_desk import (
    EXECUTION_FACTS,
    LOG_PAGE_BYTES,
    LOG_PAGE_FACTS,
    FactReceipt,
    FactSubmission,
    LoggedFact,
    LogPage,
    LogRead,
)
from contracts.subjects import attempt_failures, batch_events, event_name_of, fact_submissions, log_reads
from services.runtime.nats import eventlog
from services.runtime.nats.bus import EventBus, Fence, FenceMoved
from services.runtime.nats.delivery import Answer
from services.runtime.nats.facts import last_fact
from services.runtime.nats.kv import ScanFailed
from services.runtime.process.skip_log import SkipLog
from services.runtime.storage.objectstore import TRANSIENT, ObjectNotFound, ObjectStore
from services.scheduler.book import Book
from services.scheduler.entitlements import batch_created_ms, clamped, may_read, may_state, superseded

log = logging.getLogger(__name__)

CATCHING_UP = "The scheduler is still reading the log."
SUBMISSIONS = Answer(fact_submissions("{executor_id}"), FactSubmission,
                     lambda why: FactReceipt(status="refused", reason=f"Malformed submission: {why}"))
READS = Answer(log_reads("{executor_id}"), LogRead,
               lambda why: LogPage(status="refused", reason=f"Malformed read: {why}"))


@dataclass
class FactDesk:
    bus: EventBus
    book: Book
    caught_up: asyncio.Event
    catalogue: Catalogue | None = None
    """Models' context lengths, which bound the tokens a line's result can state (None: unbounded)."""
    store: ObjectStore | None = None
    """Where result files lie, whose stated size is checked against the object's own (None: not checked)."""
    refusals: SkipLog = field(default_factory=lambda: SkipLog(log, "refused"))

    def context_length(self, model: str) -> int | None:
        found = self.catalogue.resolve(model) if self.catalogue is not None else None
        return found.context_length if found is not None else None

    async def submit(self, executor_id: str, submission: FactSubmission) -> FactReceipt:
        """Each fact judged and stored in turn, as if alone; the first one not stored answers for the submission."""
        if not self.caught_up.is_set():
            return FactReceipt(status="retry", reason=CATCHING_UP)
        fence = Fence(submission.fence.subject, submission.fence.sequence) if submission.fence else None
        receipt = FactReceipt(status="stored")
        for fact in (submission.event, *submission.then):
            receipt = await self._store(executor_id, fact, fence)
            if receipt.status != "stored":
                break
        return receipt

    async def _store(self, executor_id: str, fact: str, fence: Fence | None) -> FactReceipt:
        try:
            event = decode_event(fact.encode()).with_derived_identity()
        except ValidationError as error:
            return FactReceipt(status="refused", reason=f"Not a fact: {error.errors()[0]['msg']}")
        refusal = may_state(self.book, executor_id, event, self.context_length)
        if refusal is not None:
            self.refusals.skipped(f"executor {executor_id}", f"{event.type} of {event.aggregate_id}: {refusal}")
            return FactReceipt(status="refused", reason=refusal)
        if isinstance(event, FileStored) and self.store is not None:
            receipt = await self._size_refusal(executor_id, event)
            if receipt is not None:
                return receipt
        event = clamped(event, int(time.time() * 1000), batch_created_ms(self.book, event))
        if superseded(self.book, event):
            last = await last_fact(self.bus, attempt_failures(event.aggregate_id))
            return FactReceipt(status="fence_moved", sequence=last[0] if last else 0)
        try:
            sequence = await self.bus.publish(event, fence)
        except FenceMoved as moved:
            return FactReceipt(status="fence_moved", sequence=moved.last_sequence)
        except (nats.errors.Error, nats.js.errors.Error) as error:
            log.warning("storing executor %s's %s failed: %r", executor_id, event.type, error)
            return FactReceipt(status="retry", reason="The event log did not take the fact.")
        return FactReceipt(status="stored", sequence=sequence)

    async def _size_refusal(self, executor_id: str, event: FileStored) -> FactReceipt | None:
        """A result file's stated size must be its object's: it counts against its owner's storage quota."""
        assert self.store is not None
        try:
            size = await self.store.size_of(event.object_key)
        except ObjectNotFound:
            size = None
        except (S3Error, *TRANSIENT) as error:  # the object store's outage: the executor asks again
            log.warning("the size of %s for executor %s was not read: %r", event.object_key, executor_id, error)
            return FactReceipt(status="retry", reason="The object store did not answer.")
        if size == event.bytes:
            return None
        refusal = f"file {event.aggregate_id} states {event.bytes} bytes; its object holds {size}"
        self.refusals.skipped(f"executor {executor_id}", refusal)
        return FactReceipt(status="refused", reason=refusal)

    async def read(self, executor_id: str, request: LogRead) -> LogPage:
        if not self.caught_up.is_set():
            return LogPage(status="retry", reason=CATCHING_UP)
        refusal = may_read(self.book, executor_id, request.batch_id)
        if refusal is not None:
            self.refusals.skipped(f"executor {executor_id}", f"a read of {request.batch_id}'s log: {refusal}")
            return LogPage(status="refused", reason=refusal)
        try:
            page, more = await eventlog.page(self.bus, batch_events(request.batch_id), request.after,
                                             LOG_PAGE_FACTS, LOG_PAGE_BYTES)
        except (ScanFailed, nats.errors.Error) as error:
            log.warning("reading %s's log for executor %s failed: %r", request.batch_id, executor_id, error)
            return LogPage(status="retry", reason="The event log did not answer.")
        facts = [LoggedFact(sequence=fact.sequence, event=fact.data.decode()) for fact in page
                 if event_name_of(fact.subject) in EXECUTION_FACTS]
        # A page of only other facts (validation's) still moves the reader on: its last sequence goes last.
        if page and (not facts or facts[-1].sequence != page[-1].sequence):
            facts.append(LoggedFact(sequence=page[-1].sequence, event=""))
        return LogPage(status="read", facts=facts, more=more)
