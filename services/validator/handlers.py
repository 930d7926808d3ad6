"""Thin handlers: a created batch in; line errors, progress and one verdict out (the table: `validator_router`)."""

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field

from contracts.api.rejected_line import RejectedLine
from contracts.catalogue import Catalogue
from contracts.events.batch import (
    BatchCreated,
    BatchFailed,
    BatchValidated,
    BatchValidationFailed,
    LineRejected,
    ValidationProgressed,
)
from contracts.events.file import FileStored
from contracts.ids import owner_id
from contracts.subjects import BATCH_CREATED, EVENTS_STREAM, VALIDATOR_DURABLE, rejections_key
from services.runtime.nats.bus import ConsumerPolicy, EventBus, PoisonMessage
from services.runtime.nats.delivery import Durable, ServiceRouter
from services.runtime.process.tasks import cancel_and_join
from services.runtime.storage.objectstore import ObjectNotFound, ObjectStore
from services.runtime.storage.write_failures import through_write_faults
from services.validator.adapters.check_pool import CheckPool
from services.validator.adapters.error_file import write_error_file
from services.validator.adapters.input_lines import lines_by_chunk
from services.validator.adapters.starts import ValidationStarts
from services.validator.adapters.tokenizer import TokenizerCache
from services.validator.domain import FileValidation, Limits
from services.validator.fair_turns import FairTurns
from services.validator.file_check import FileCheck, Findings
from services.validator.issues import LineIssue
from services.validator.observe import count_lines

log = logging.getLogger(__name__)

MAX_STARTS = 5
"""Checks of one batch begun and not finished (the validator stopped in it, or it failed) before it is given up."""
PROGRESS_EVERY_LINES = 5000
PROGRESS_EVERY_S = 0.5


@dataclass
class Validator:
    bus: EventBus
    store: ObjectStore
    catalogue: Catalogue
    limits: Limits
    max_published_per_code: int
    tokenizers: TokenizerCache | None = None
    pool: CheckPool | None = None
    """Worker processes that check windows beside this one; None: every window is checked here."""
    turns: FairTurns = field(default_factory=lambda: FairTurns(1))
    """Whose batch is checked next (`fair_turns.py`): the facts taken at once (`INTAKE`) wait here for their turn."""
    starts: ValidationStarts | None = None
    """Each batch's validations started (None: not counted, a test's validator)."""

    async def take(self, created: BatchCreated) -> None:
        """Validate the batch's file in its owner's turn; a full disk or a restarting broker is waited out without
        spending the fact's deliveries (which would fail the batch): validation is idempotent. One whose check was
        started `MAX_STARTS` times before and never finished (failed, or the validator stopped in it) is given up."""
        async with self.turns.turn(owner_id(created.owner_user_id, created.terms.owner_key_id)):
            if self.starts is not None and (started := await self.starts.begun(created.aggregate_id)) > MAX_STARTS:
                raise PoisonMessage(f"its check was started {started - 1} times and never finished (it failed, or "
                                    "the validator stopped in it)")
            await through_write_faults(lambda: self.validate(created), f"validating batch {created.aggregate_id}")

    async def fail_the_batch(self, created: BatchCreated, error: BaseException) -> None:
        await self.bus.publish(BatchFailed(aggregate_id=created.aggregate_id, code="validation_error",
                                           reason=f"The input file could not be validated: {error}",
                                           causation_id=created.event_id))

    async def validate(self, created: BatchCreated) -> None:
        # The owner's model access travels in the fact: a model they may not use is as unknown as an absent one.
        catalogue = self.catalogue.restricted_to(created.allowed_models)
        allowed = None if created.allowed_models is None else tuple(created.allowed_models)
        run = _Run(self, created, FileValidation(created.terms.endpoint, catalogue, self.limits, self.tokenizers,
                                                 default_model=created.default_model,
                                                 revision=(created.metadata or {}).get("revision"),
                                                 allowed_models=allowed))
        # One thread reads and checks the file; this loop publishes what it finds, as it finds it.
        loop = asyncio.get_running_loop()
        findings: asyncio.Queue[Findings | None] = asyncio.Queue()
        stopped = threading.Event()

        def hand_over(found: Findings | None) -> None:
            loop.call_soon_threadsafe(findings.put_nowait, found)

        def check_file() -> None:
            try:
                FileCheck(run.validation, hand_over, stopped, self.pool).run(
                    lines_by_chunk(self.store, created.terms.input_object_key,
                                   run.validation.limits.max_line_bytes))
            finally:
                hand_over(None)

        checking = asyncio.ensure_future(asyncio.to_thread(check_file))
        try:
            while (found := await findings.get()) is not None:
                await run.take(found)
            await checking
        except ObjectNotFound as error:
            raise PoisonMessage(f"input file {created.input_file_id} is missing from the object store") from error
        finally:
            stopped.set()
            await cancel_and_join([checking])
        await publish_in_order(self.bus, list(filter(None, (run.line_rejected(None, None, issue)
                                                             for issue in run.validation.finish()))))
        await run.progress(run.validation.total_lines, run.validation.error_count)
        log.info("batch %s: %d lines, %d errors", created.aggregate_id, run.validation.total_lines,
                 run.validation.error_count)
        count_lines(run.validation.total_lines, run.validation.runnable_lines)
        await run.verdict()


class _Run:
    """One validation of one file: what has been published so far."""

    def __init__(self, validator: Validator, created: BatchCreated, validation: FileValidation) -> None:
        self.v = validator
        self.created = created
        self.validation = validation
        """Read and changed by the checking thread only, until it has ended."""
        self.published_by_code: dict[str, int] = {}
        self.rejected: dict[int, RejectedLine] = {}
        """Every refused line by its line number (at most the line limit and one: later lines are not read)."""
        self.last_progress_at = time.monotonic()
        self.last_progress_lines = 0

    async def take(self, found: Findings) -> None:
        events: list[LineRejected] = []
        for result, record in found.refused:
            self.rejected[result.line] = record
            events += filter(None, (self.line_rejected(result.line, result.custom_id, issue)
                                    for issue in result.issues))
        await publish_in_order(self.v.bus, events)
        lines = found.lines_read
        if lines - self.last_progress_lines >= PROGRESS_EVERY_LINES or (
                lines > self.last_progress_lines and time.monotonic() - self.last_progress_at >= PROGRESS_EVERY_S):
            await self.progress(lines, found.errors_found)

    def _envelope(self) -> dict[str, str]:
        return {"aggregate_id": self.created.aggregate_id, "causation_id": self.created.event_id,
                "correlation_id": self.created.aggregate_id}

    def line_rejected(self, line: int | None, custom_id: str | None, issue: LineIssue) -> LineRejected | None:
        """The fact of an error if it is among the first `max_published_per_code` of its code (the rest are only
        counted): that keeps the file's first errors and examples of every code."""
        published = self.published_by_code.get(issue.code, 0)
        if published >= self.v.max_published_per_code:
            return None
        self.published_by_code[issue.code] = published + 1
        return LineRejected(**self._envelope(), line=line, code=issue.code, param=issue.param, message=issue.message,
                            custom_id=custom_id)

    async def progress(self, lines_read: int, errors_found: int) -> None:
        self.last_progress_at = time.monotonic()
        self.last_progress_lines = lines_read
        await self.v.bus.publish(ValidationProgressed(**self._envelope(), lines_read=lines_read,
                                                      errors_found=errors_found))

    async def verdict(self) -> None:
        """Publish the verdict; a failed batch's error file first, so the verdict can name it."""
        validation, created = self.validation, self.created
        if validation.passed or (created.allow_partial and validation.partial_run_possible):
            assert validation.model_id is not None
            key = None
            if self.rejected:
                key = rejections_key(created.aggregate_id)
                body = b"".join(r.model_dump_json().encode() + b"\n" for r in self.rejected.values())
                await self.v.store.put_bytes(key, body)
            await self.v.bus.publish(BatchValidated(
                **self._envelope(), total_lines=validation.total_lines, model=validation.model_id,
                rejected_lines=len(self.rejected), rejections_object_key=key, error_count=validation.error_count,
                counts_by_code=validation.counts_by_code))
            return
        stored = await write_error_file(self.v.store, created, validation, self.rejected)
        if stored is not None:
            await self.v.bus.publish(stored)
        await self.v.bus.publish(BatchValidationFailed(
            **self._envelope(), total_lines=validation.total_lines, error_count=validation.error_count,
            counts_by_code=validation.counts_by_code, rejected_lines=validation.rejected_lines,
            reason=validation.failure_reason(), error_file_id=stored.aggregate_id if stored else None))


async def publish_in_order(bus: EventBus, events: list[LineRejected]) -> None:
    """Publish facts in this order, their acks awaited together: each publish puts its message on the connection
    before the next task starts, except the connection's very first request (it opens its reply subscription
    first), so the first fact goes alone."""
    if not events:
        return
    await bus.publish(events[0])
    outcomes = await asyncio.gather(*(bus.publish(event) for event in events[1:]), return_exceptions=True)
    failed = next((outcome for outcome in outcomes if isinstance(outcome, BaseException)), None)
    if failed is not None:
        raise failed


INTAKE = 64
"""Created batches taken from the log at once, each kept leased while it waits for its owner's turn: the window in
which owners take turns (beyond it, the log's order)."""
CREATED = Durable(BatchCreated, EVENTS_STREAM, VALIDATOR_DURABLE, BATCH_CREATED,
                  ConsumerPolicy(ack_wait_s=30, max_deliver=20, max_ack_pending=INTAKE, redeliver_forever=True,
                                 release_on_stop=True))
"""A validator killed while batches wait for their turn hands them all out again, each delivery counted: the server
redelivers without limit (at its limit it would drop a batch killed on its last delivery, left `validating` for
good, and every batch waiting beside it). A batch whose check keeps failing, or that the validator keeps stopping in,
is given up after `MAX_STARTS` starts (`ValidationStarts`); `max_deliver` is only a backstop."""


def validator_router() -> ServiceRouter:
    """The validator's table (a fresh router each call: faststream lets a router belong to one broker only)."""
    router = ServiceRouter("validator", dependencies="validator")
    router.durable(CREATED, Validator.take, Validator.fail_the_batch,
                   "Check every line of the batch's input file, owners taking turns; publish its line errors, then "
                   "one verdict.", max_workers=INTAKE)
    router.emits(LineRejected, ValidationProgressed, BatchValidated, BatchValidationFailed, FileStored, BatchFailed)
    return router
