"""Thin handlers: a created batch in; line errors, progress and one verdict out.

The table (`validator_router`, at the end): `validate` takes each `batch.created` fact on the `validator` durable;
a file that can never be validated fails its batch (`fail_the_batch`); the facts it publishes are declared there too.
"""

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Annotated

from faststream import Context

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
from contracts.subjects import BATCH_CREATED, EVENTS_STREAM, VALIDATOR_DURABLE, rejections_key
from services.runtime.bus import ConsumerPolicy, EventBus, PoisonMessage
from services.runtime.delivery import Durable, ServiceRouter
from services.runtime.objectstore import ObjectNotFound, ObjectStore
from services.runtime.tasks import cancel_and_join
from services.runtime.write_failures import through_write_faults
from services.validator.adapters.check_pool import CheckPool
from services.validator.adapters.error_file import write_error_file
from services.validator.adapters.tokenizer import TokenizerCache
from services.validator.domain import FileValidation, Limits, LineResult, Window
from services.validator.issues import LineIssue
from services.validator.line_checks import check_lines
from services.validator.observe import count_lines
from services.validator.refusals import rejected_line
from services.validator.rules import LineVerdict

log = logging.getLogger(__name__)

WINDOW_LINES = 256
"""Lines checked together off the event loop; their prompts are counted in one tokenizer batch."""
WORKER_QUEUE = 2
"""Windows each worker process holds (one checked, one waiting): this process, which also reads the file and applies
the file's rules, checks a window itself only when every worker has its queue full."""
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

    async def validate(self, created: BatchCreated) -> None:
        # The owner's model access travels in the fact: a model they may not use is as unknown as an absent one.
        catalogue = self.catalogue.restricted_to(created.allowed_models)
        allowed = None if created.allowed_models is None else tuple(created.allowed_models)
        run = _Run(self, created, FileValidation(created.endpoint, catalogue, self.limits, self.tokenizers,
                                                 default_model=created.default_model,
                                                 revision=(created.metadata or {}).get("revision"),
                                                 allowed_models=allowed))
        window: list[tuple[int, bytes]] = []
        read = 0
        try:
            async for raw in self.store.iter_lines(created.input_object_key):
                read += 1
                window.append((read, raw))
                if len(window) >= WINDOW_LINES:
                    await run.send(window)
                    window = []
            await run.send(window)
            await run.drain()
        except ObjectNotFound as error:
            raise PoisonMessage(f"input file {created.input_file_id} is missing from the object store") from error
        finally:
            await run.abandon()
        for issue in run.validation.finish():
            await run.publish_issue(None, None, issue)
        await run.progress()
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
        self.published_by_code: dict[str, int] = {}
        self.rejected: dict[int, RejectedLine] = {}
        """Every refused line by its line number (at most the line limit and one: later lines are not read)."""
        self.last_progress_at = time.monotonic()
        self.last_progress_lines = 0
        self.in_flight: deque[tuple[Window, asyncio.Future[list[LineVerdict | None]], bool]] = deque()
        """Windows sent and not yet applied, oldest first: (window, its verdicts, whether checked here)."""

    async def send(self, lines: list[tuple[int, bytes]]) -> None:
        """Check a window, beside the ones sent before it: here (one at a time, off the loop) and in the worker
        processes (one each); their results are applied and reported in line order."""
        if not lines:
            return
        validation, pool = self.validation, self.v.pool
        capacity = 1 + (pool.processes * WORKER_QUEUE if pool is not None else 0)
        while self.in_flight and (validation.awaits_line_model or len(self.in_flight) >= capacity):
            await self.receive()
        window = validation.plan(lines)
        in_workers = sum(1 for _, _, here in self.in_flight if not here)
        here = pool is None or validation.awaits_line_model or in_workers >= pool.processes * WORKER_QUEUE
        task: asyncio.Future[list[LineVerdict | None]]
        if here:
            task = asyncio.ensure_future(asyncio.to_thread(check_lines, window.to_check, window.spec,
                                                           validation.catalogue, validation.tokenizers))
        else:
            assert pool is not None
            task = asyncio.ensure_future(pool.check(window.spec, window.to_check, validation.catalogue,
                                                    validation.tokenizers))
        self.in_flight.append((window, task, here))
        if validation.awaits_line_model:
            await self.drain()

    async def receive(self) -> None:
        window, task, _ = self.in_flight.popleft()
        results = self.validation.apply(window, await task)
        for result in results:
            await self.report(result)
        await self.maybe_progress()

    async def drain(self) -> None:
        while self.in_flight:
            await self.receive()

    async def abandon(self) -> None:
        """Windows still in flight when the validation stopped (it failed, or was cancelled) are let go."""
        while self.in_flight:
            _, task, _ = self.in_flight.popleft()
            await cancel_and_join([task])

    def _envelope(self) -> dict[str, str]:
        return {"aggregate_id": self.created.aggregate_id, "causation_id": self.created.event_id,
                "correlation_id": self.created.aggregate_id}

    async def report(self, result: LineResult) -> None:
        if not result.issues:
            return
        self.rejected[result.line] = rejected_line(result)
        for issue in result.issues:
            await self.publish_issue(result.line, result.custom_id, issue)

    async def publish_issue(self, line: int | None, custom_id: str | None, issue: LineIssue) -> None:
        # Every error is counted; the first ones of each code are published in full, as soon as they are found.
        # (Capping per code keeps the file's first errors overall too, and examples of every code.)
        published = self.published_by_code.get(issue.code, 0)
        if published < self.v.max_published_per_code:
            self.published_by_code[issue.code] = published + 1
            await self.v.bus.publish(LineRejected(**self._envelope(), line=line, code=issue.code, param=issue.param,
                                                  message=issue.message, custom_id=custom_id))

    async def maybe_progress(self) -> None:
        lines = self.validation.total_lines
        if lines - self.last_progress_lines >= PROGRESS_EVERY_LINES or (
                lines > self.last_progress_lines and time.monotonic() - self.last_progress_at >= PROGRESS_EVERY_S):
            await self.progress()

    async def progress(self) -> None:
        self.last_progress_at = time.monotonic()
        self.last_progress_lines = self.validation.total_lines
        await self.v.bus.publish(ValidationProgressed(**self._envelope(), lines_read=self.validation.total_lines,
                                                      errors_found=self.validation.error_count))

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
                owner_key_id=created.owner_key_id, endpoint=created.endpoint,
                input_object_key=created.input_object_key, rejected_lines=len(self.rejected),
                rejections_object_key=key, error_count=validation.error_count,
                counts_by_code=validation.counts_by_code))
            return
        stored = await write_error_file(self.v.store, created, validation, self.rejected)
        if stored is not None:
            await self.v.bus.publish(stored)
        await self.v.bus.publish(BatchValidationFailed(
            **self._envelope(), total_lines=validation.total_lines, error_count=validation.error_count,
            counts_by_code=validation.counts_by_code, rejected_lines=validation.rejected_lines,
            reason=validation.failure_reason(), error_file_id=stored.aggregate_id if stored else None))


CREATED = Durable(BatchCreated, EVENTS_STREAM, VALIDATOR_DURABLE, BATCH_CREATED,
                  ConsumerPolicy(ack_wait_s=30, max_deliver=5))


async def validate(created: BatchCreated, validator: Annotated[Validator, Context()]) -> None:
    # A full disk or a restarting broker is waited out, spending none of the fact's deliveries (which would fail
    # the batch): validation is idempotent, so it is simply done again.
    await through_write_faults(lambda: validator.validate(created), f"validating batch {created.aggregate_id}")


async def fail_the_batch(created: BatchCreated | None, error: BaseException, validator: Validator) -> None:
    if created is None:
        log.error("dropping a created-batch fact that does not decode: %r", error)
        return
    await validator.bus.publish(BatchFailed(aggregate_id=created.aggregate_id, code="validation_error",
                                            reason=f"The input file could not be validated: {error}",
                                            causation_id=created.event_id))


def validator_router() -> ServiceRouter:
    """The validator's table: what it consumes, by which handler, what a hopeless fact becomes; what it emits.
    (A fresh router each call: faststream lets a router belong to one broker only.)"""
    router = ServiceRouter("validator", dependencies="validator")
    router.durable(CREATED, validate, fail_the_batch,
                   "Check every line of the batch's input file; publish its line errors, then one verdict.")
    router.emits(LineRejected, ValidationProgressed, BatchValidated, BatchValidationFailed, FileStored, BatchFailed)
    return router
