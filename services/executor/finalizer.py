"""The one way a batch ends (`Finalizer.finish`), by its only shard's attempt or a finalize command: files assembled
from every committed chunk, then the end announced; redone, it writes the same files under the same ids and facts."""

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from contracts.commands import FinalizeBatch, RunBatch
from contracts.events.batch import BatchCancelled, BatchCompleted, BatchExpired, BatchFailed, BatchFinalizing
from contracts.events.envelope import Event
from contracts.ids import ResultFileKind, error_file_id, output_file_id, result_file_name
from contracts.lifecycle import EndReason
from services.executor.adapters.desk import publish_in_order
from services.executor.adapters.objects import ObjectAccess
from services.executor.adapters.results import LOOK, ResultStore
from services.executor.attempts import BatchLog, counts_as_committed
from services.executor.chunk_lines import ResultLine
from services.executor.domain import CommittedLine, Resume, assemble, parse_input_line, unrun_line, usage_of
from services.runtime.nats.bus import EventBus

log = logging.getLogger(__name__)

UNRUN_MESSAGES = {
    "batch_cancelled": "The batch was cancelled before this request ran.",
    "batch_expired": "The batch expired before this request ran.",
    "authorization_revoked": "The API key that created this batch was revoked before this request ran.",
    "batch_failed": "The batch failed before this request ran.",
    "insufficient_credits": "The organisation's balance ran out before this request ran.",
}


class Publish(Protocol):
    async def __call__(self, *events: Event) -> bool:
        """Publishes the facts in order; False once the publisher's lease is gone (from the refused one on)."""


@dataclass
class Ender:
    """Who ends a batch: its only shard's running attempt (fenced, holding its chunks) or a finalize command."""

    log: BatchLog
    """The batch's log as the ender read it."""
    read_log: Callable[[], Awaitable[BatchLog]]
    """The log read to its end now: through the `finalizing` fact just stated, and any cancel before it."""
    publish: Publish | None = None
    """Fenced by the attempt's lease; None: unfenced (a finalize command)."""
    attempt: int = 0
    """Whose `finalizing` fact it states: the attempt's, or 0 (a finalize command's)."""
    announced: set[str] = field(default_factory=set)
    """Chunks it announced that its log may not show yet."""
    in_hand: Sequence[tuple[str, Sequence[ResultLine]]] | None = None
    """The chunks it read on resuming or committed itself (with the refused lines)."""


class Finalizer:
    def __init__(self, bus: EventBus, store: ObjectAccess, results: ResultStore) -> None:
        self.bus = bus
        self.store = store
        self.results = results

    async def _publish_unfenced(self, *events: Event) -> bool:
        await publish_in_order(self.bus, events)
        return True

    async def finish(self, batch: RunBatch | FinalizeBatch, asked: EndReason, ender: Ender,
                     stating: Sequence[Event] = ()) -> bool:
        """Completing, state `finalizing` (after `stating`) and read the log back: a cancel accepted before that fact
        decides. Then write the files and state the end. False once the ender's lease is gone."""
        completing = asked == "completed"
        if completing:
            stating = [*stating, BatchFinalizing(aggregate_id=batch.batch_id, attempt=ender.attempt)]
        publish = ender.publish or self._publish_unfenced
        if stating and not await publish(*stating):
            return False
        batch_log = await ender.read_log() if completing else ender.log
        outcome = batch_log.outcome(asked)
        announced = batch_log.announced | ender.announced
        counts = counts_as_committed(announced)
        chunks: Sequence[tuple[str, Sequence[ResultLine]]]
        if ender.in_hand is not None and announced <= {key for key, _ in ender.in_hand}:
            chunks = [(key, lines) for key, lines in ender.in_hand if counts(key)]  # nothing is read back
        else:
            rejections = batch.rejections_object_key if isinstance(batch, RunBatch) else LOOK
            chunks = await self.results.committed(batch.batch_id, counts, rejections)
        if isinstance(batch, RunBatch):
            return await self.finalize(batch, outcome, chunks, publish,
                                       batch_log.cancel_code if outcome == "cancelled" else None, completing)
        # A finalize command's files hold, of each chunk, only the lines of the unit its attempt was assigned.
        chunks = [(key, [line for line in lines if batch_log.holds_line(key, line.line)]) for key, lines in chunks]
        code = batch.code if outcome == batch.reason else batch_log.cancel_code  # a cancel came first
        return await self.finalize(batch, outcome, chunks, publish, code)

    async def finalize(self, command: RunBatch | FinalizeBatch, outcome: EndReason,
                       chunks: Sequence[tuple[str, Sequence[ResultLine]]], publish: Publish, code: str | None = None,
                       all_lines_ran: bool = False) -> bool:
        """Write both files of the committed `chunks` and publish the terminal fact; False once `publish` refuses.
        Lines never run get `code` (default `batch_<outcome>`); unless `all_lines_ran`, the input is read for them."""
        batch_id = command.batch_id
        committed = Resume.from_chunks(chunks, attempt=0).committed
        lines: list[ResultLine] = list(committed.values())
        if not all_lines_ran:
            unrun = await self._unrun(command, code or f"batch_{outcome}", set(committed))
            if unrun and outcome == "completed":
                log.error("batch %s completed with %d lines no attempt committed; they go to the error file",
                          batch_id, len(unrun))
            lines.extend(unrun)
        files = assemble(lines)
        output_id = output_file_id(batch_id) if files.output_lines else None
        error_id = error_file_id(batch_id) if files.error_lines else None
        # Announced with the batch's end, in one submission; each expires counted from its own creation.
        kinds: tuple[tuple[ResultFileKind, str | None, bytes, int], ...] = (
            ("output", output_id, files.output, files.output_lines),
            ("error", error_id, files.errors, files.error_lines))
        stored: list[Event] = [
            await self.results.put_file(batch_id, file_id, data, command.terms.owner_key_id,
                                        result_file_name(batch_id, kind), count, command.terms.output_expires_after_s)
            for kind, file_id, data, count in kinds if file_id]
        terminal: Event
        if outcome == "failed":
            # A failed batch still delivers what it committed; its fact names the cause.
            failure = command if isinstance(command, FinalizeBatch) else None
            terminal = BatchFailed(
                aggregate_id=batch_id, output_file_id=output_id, error_file_id=error_id,
                completed=files.output_lines, failed=files.error_lines, usage=usage_of(lines),
                code=(failure and failure.failure_code) or "batch_failed",
                reason=(failure and failure.failure_message) or "The batch failed.")
        else:
            terminal = {"completed": BatchCompleted, "cancelled": BatchCancelled, "expired": BatchExpired}[outcome](
                aggregate_id=batch_id, output_file_id=output_id, error_file_id=error_id,
                completed=files.output_lines, failed=files.error_lines, usage=usage_of(lines))
        if not await publish(*stored, terminal):
            return False
        log.info("batch %s %s: %d output lines, %d error lines", batch_id, outcome, files.output_lines,
                 files.error_lines)
        return True

    async def _unrun(self, command: RunBatch | FinalizeBatch, code: str,
                     committed_lines: set[int]) -> list[CommittedLine]:
        message = UNRUN_MESSAGES.get(code, "This request never ran.")
        unrun: list[CommittedLine] = []
        number = 0
        async for raw in self.store.iter_lines(command.terms.input_object_key):
            number += 1
            if number in committed_lines:
                continue
            line = parse_input_line(number, raw)
            if line is not None:
                unrun.append(unrun_line(command.batch_id, line, code, message))
        return unrun
