"""The Batch, whose state machine folds every fact about one batch (each once; one that does not fit is kept as an
anomaly)."""

from typing import Any
from uuid import UUID

from eventsourcing.domain import Aggregate, event

from contracts.events.batch import ISSUE_MESSAGE_CHARS, ISSUE_PARAM_CHARS, clipped
from contracts.lifecycle import CANCELLABLE, IN_FLIGHT, RELEASABLE, RUNNING, TERMINAL, UNFINISHED
from services.ledger.folded import Folded, aggregate_id, upcast_defaults

STANDING_TOO_LATE = frozenset({"finalizing", "cancelling", *TERMINAL})
"""Statuses in which a standing (`batch.waiting`) arrives only from a view of before: it is dropped unremarked."""
ERRORS_KEPT = 100
"""Rejected lines kept in full on a batch; the rest are only counted."""
BATCH_ENDS = frozenset({"batch_cancelled", "batch_expired", "attempts_exhausted"})
"""Attempt endings that are the batch's own end (said by its cancel, expiry or failure), not a run-time failure."""


def validation_reason(total_lines: int, error_count: int, rejected_lines: int | None) -> str:
    """Why validation failed, from its counts (verdicts that say why themselves are shown as they say it)."""
    if rejected_lines is None:  # a verdict from before lines were counted apart from errors
        return f"validation found {error_count} errors in {total_lines} input lines"
    counted = f"{rejected_lines} of {total_lines} input lines failed validation"
    return counted if error_count == rejected_lines else f"{counted} ({error_count} errors)"


class Batch(Folded):
    class_version = 2
    upcast_v1_v2 = upcast_defaults(attempt_failures=[], cancel_requested_by=None)

    @event("Created")
    def __init__(self, batch_id: str, sequence: int, owner_key_id: str, input_file_id: str, endpoint: str,
                 completion_window: str, metadata: dict[str, str] | None, created_at: int,
                 expires_at: int | None, held: bool = False, billing_account: str | None = None,
                 placement: str = "approved_providers") -> None:
        self.held, self.placement = held, placement  # stored Created events from before fold with the defaults
        self.billing_account = billing_account
        """The account its usage is debited from (billing on when it was created); None: not billed."""
        self.batch_id, self.owner_key_id, self.input_file_id = batch_id, owner_key_id, input_file_id
        self.endpoint, self.completion_window, self.metadata = endpoint, completion_window, metadata
        self.created_at, self.expires_at, self.last_sequence = created_at, expires_at, sequence
        self.status, self.anomalies = "validating", []
        self.model: str | None = None
        self.total = self.completed = self.failed = self.attempt = 0
        self.errors: list[dict[str, Any]] = []
        self.error_total = 0
        self.counts_by_code: dict[str, int] = {}
        self.executor_id: str | None = None
        self.engine: str | None = None
        self.engine_version: str | None = None
        self.times: dict[str, int] = {}
        """`in_progress_at`, `finalizing_at`, … in epoch seconds."""
        self.output_file_id: str | None = None
        self.error_file_id: str | None = None
        self.usage: dict[str, Any] | None = None
        self.status_reason: str | None = None
        self.failure_code: str | None = None
        self.attempt_failures: list[dict[str, Any]] = []
        self.cancel_requested_by: str | None = None

    @classmethod
    def create_id(cls, batch_id: str) -> UUID:
        return aggregate_id("batch", batch_id)

    def reject_line(self, sequence: int, line: int | None, code: str, param: str | None, message: str) -> None:
        if not self.refuses(sequence, "line_rejected", self.status, self._validating()):
            self._line_rejected(sequence, line, code, param, message)

    @event("LineRejected")
    def _line_rejected(self, sequence: int, line: int | None, code: str, param: str | None, message: str) -> None:
        self.last_sequence = sequence
        self._note_error(code, message, line, param)

    def validate(self, sequence: int, at: int, model: str, total_lines: int, error_count: int | None = None,
                 counts_by_code: dict[str, int] | None = None) -> None:
        if not self.refuses(sequence, "validated", self.status, self._validating()):
            self._validated(sequence, at, model, total_lines, error_count, counts_by_code)

    @event("Validated")
    def _validated(self, sequence: int, at: int, model: str, total_lines: int, error_count: int | None = None,
                   counts_by_code: dict[str, int] | None = None) -> None:
        # Older events fold with the defaults (no totals); cancelled while validating, the batch stays `cancelling`.
        status = "validated" if self.status == "validating" else self.status
        self.last_sequence, self.status, self.model, self.total = sequence, status, model, total_lines
        self.times["validated_at"] = at
        self._take_totals(error_count, counts_by_code)

    def _take_totals(self, error_count: int | None, counts_by_code: dict[str, int] | None) -> None:
        """The validator's totals are authoritative: it counted every error, and published only the first ones."""
        if error_count is not None and counts_by_code is not None:
            self.error_total, self.counts_by_code = error_count, dict(counts_by_code)

    def _validating(self) -> tuple[str, ...]:
        """`validating`, and `cancelling` when the cancel came before the validator's verdict (which may still come)."""
        cancelled_first = self.status == "cancelling" and "validated_at" not in self.times
        return ("validating", "cancelling") if cancelled_first else ("validating",)

    def fail_validation(self, sequence: int, at: int, total_lines: int, error_count: int,
                        counts_by_code: dict[str, int], rejected_lines: int | None = None,
                        reason: str | None = None, error_file_id: str | None = None) -> None:
        if not self.refuses(sequence, "validation_failed", self.status, self._validating()):
            self._validation_failed(sequence, at, total_lines, error_count, counts_by_code, rejected_lines, reason,
                                    error_file_id)

    @event("ValidationFailed")
    def _validation_failed(self, sequence: int, at: int, total_lines: int, error_count: int,
                           counts_by_code: dict[str, int], rejected_lines: int | None = None,
                           reason: str | None = None, error_file_id: str | None = None) -> None:
        # Older events fold with the defaults; cancelled while validating, the cancel came first and decides.
        ended = "cancelled" if self.status == "cancelling" else "failed"
        self.last_sequence, self.status, self.total = sequence, ended, total_lines
        self._take_totals(error_count, counts_by_code)
        self.times[f"{ended}_at"] = at
        if ended == "failed":
            self.status_reason = reason or validation_reason(total_lines, error_count, rejected_lines)
        if error_file_id is not None:
            # The error file accounts for every input line: refused ones and those that did not run.
            self.error_file_id, self.failed = error_file_id, total_lines

    def assign(self, sequence: int, executor_id: str, attempt: int, shard: int = 0,
               provider_id: str | None = None) -> None:
        if self.refuses(sequence, "assigned", self.status, ("validated", "in_progress")):
            return
        if attempt <= self.attempt:
            self.note_anomaly(sequence, "assigned", f"attempt {attempt} is not after attempt {self.attempt}")
            return
        self._assigned(sequence, executor_id, attempt, provider_id)
        self._attempt_opened(attempt=attempt, shard=shard)

    @event("AttemptOpened")
    def _attempt_opened(self, attempt: int, shard: int) -> None:
        # State added with sharding: aggregates folded before it lack it (getattr), and keep the old rules.
        self.attempt_shards = {**getattr(self, "attempt_shards", {}), str(attempt): shard}
        self.live_attempts = sorted({*getattr(self, "live_attempts", []), attempt})

    def _superseded(self, attempt: int) -> bool:
        """A later attempt was assigned to the same shard."""
        shards: dict[str, int] = getattr(self, "attempt_shards", {})
        if not shards:
            return attempt < self.attempt
        shard = shards.get(str(attempt), 0)
        return any(int(other) > attempt and other_shard == shard for other, other_shard in shards.items())

    def _close_attempt(self, attempt: int) -> bool:
        """Forget a live attempt; True when none is left running (with pre-sharding state: the latest ended)."""
        live: list[int] | None = getattr(self, "live_attempts", None)
        if live is None:
            return attempt >= self.attempt
        self.live_attempts = [other for other in live if other != attempt]
        return not self.live_attempts

    @event("Assigned")
    def _assigned(self, sequence: int, executor_id: str, attempt: int, provider_id: str | None = None) -> None:
        self.last_sequence, self.executor_id, self.attempt = sequence, executor_id, attempt
        self._note_runner(attempt, executor_id)
        if provider_id is not None:  # the provider of the executor then (None: the platform's own, or unknown)
            self.attempt_providers = {**getattr(self, "attempt_providers", {}), str(attempt): provider_id}

    def _note_runner(self, attempt: int, executor_id: str) -> None:
        # Snapshots from before this map existed lack it; string keys survive the JSON of a snapshot.
        self.attempt_executors = {**getattr(self, "attempt_executors", {}), str(attempt): executor_id}

    def executor_of(self, attempt: int) -> str | None:
        """The executor that ran `attempt`; the latest one when it was never recorded (attempt 0, old state)."""
        return getattr(self, "attempt_executors", {}).get(str(attempt)) or self.executor_id

    def start(self, sequence: int, at: int, executor_id: str, attempt: int, engine: str, engine_version: str) -> None:
        if self.status == "cancelling" and "validated_at" in self.times:
            return  # its executor began the attempt before it read the cancel: a race it cannot avoid, no anomaly
        if self.refuses(sequence, "started", self.status, ("validated", "in_progress")):
            return
        if self._superseded(attempt) or any(failure["attempt"] == attempt for failure in self.attempt_failures):
            self.note_anomaly(sequence, "started", f"attempt {attempt} is stale (latest is {self.attempt})")
            return
        self._started(sequence, at, executor_id, attempt, engine, engine_version)

    @event("Started")
    def _started(self, sequence: int, at: int, executor_id: str, attempt: int, engine: str,
                 engine_version: str) -> None:
        if self.status != "in_progress":  # the queue's reason ends; a running batch's standing holds
            self.status_reason = None
        self.last_sequence, self.status = sequence, "in_progress"
        self.executor_id, self.attempt = executor_id, max(self.attempt, attempt)
        self.engine, self.engine_version = engine, engine_version
        self._note_runner(attempt, executor_id)
        self.times.setdefault("in_progress_at", at)

    def may_progress(self, sequence: int) -> bool:
        """Whether a progress fact at `sequence` would be applied (so several may be applied as one)."""
        return not self.has_folded(sequence) and self.status in self._progress_allowed()

    def _progress_allowed(self) -> tuple[str, ...]:
        # Results of a lost attempt are durable too (the next attempt skips them): counted while it waits.
        return ("in_progress", "cancelling", "validated") if self.attempt else ("in_progress",)

    def progress(self, sequence: int, attempt: int, completed: int, failed: int, shard: int = 0,
                 usage: tuple[int, int, int] = (0, 0, 0), chunks: tuple[str, ...] = ()) -> None:
        if not self.refuses(sequence, "progressed", self.status, self._progress_allowed()):
            self._progressed(sequence, attempt, completed, failed, shard, list(usage), list(chunks))

    def counted_chunk(self, chunk_key: str) -> bool:
        """Whether a result chunk's tokens are in the batch's running usage already."""
        return chunk_key in getattr(self, "usage_chunks", ())

    def _forget_chunks(self) -> None:
        """Ended, the batch takes no more progress (nor debits): the keys of its counted chunks, kept only so none is
        counted twice, would only grow every snapshot of its state (and of the archive's) with its lines."""
        if getattr(self, "usage_chunks", None):
            self.usage_chunks: list[str] = []

    class Progressed(Aggregate.Event):
        """v2 added `attempt`: which attempt made these lines durable (0 = not recorded); v3 `shard`; v4 `usage`
        (input, cached, output tokens of the chunks it names) and `chunks`."""

        class_version = 4
        sequence: int
        attempt: int
        completed: int
        failed: int
        shard: int
        usage: list[int]
        chunks: list[str]
        upcast_v1_v2 = upcast_defaults(attempt=0)
        upcast_v2_v3 = upcast_defaults(shard=0)
        upcast_v3_v4 = upcast_defaults(usage=[0, 0, 0], chunks=[])

    @event(Progressed)
    def _progressed(self, sequence: int, attempt: int, completed: int, failed: int, shard: int, usage: list[int],
                    chunks: list[str]) -> None:
        # Counts are cumulative per shard (a late chunk of an older attempt never lowers them); usage adds each chunk's
        # tokens once, as the batch's results commit.
        if chunks:
            self.usage_chunks = [*getattr(self, "usage_chunks", []), *chunks]
            before = getattr(self, "running_usage", [0, 0, 0])
            self.running_usage = [a + b for a, b in zip(before, usage, strict=True)]
        self.last_sequence = sequence
        counts: dict[str, list[int]] = dict(getattr(self, "shard_counts", None) or {"0": [self.completed, self.failed]})
        done, failures = counts.get(str(shard), [0, 0])
        counts[str(shard)] = [max(done, completed), max(failures, failed)]
        self.shard_counts = counts
        self.completed = sum(pair[0] for pair in counts.values())
        self.failed = sum(pair[1] for pair in counts.values())

    def finish_shard(self, sequence: int, attempt: int, shard: int, stopped: bool) -> None:
        if not self.refuses(sequence, "shard_finished", self.status, IN_FLIGHT | {"validated"}):
            self._shard_finished(sequence, attempt, shard, stopped)

    @event("ShardFinished")
    def _shard_finished(self, sequence: int, attempt: int, shard: int, stopped: bool) -> None:
        self.last_sequence = sequence  # (which shard, and whether it stopped, is the log's to say: no view reads it)
        self._close_attempt(attempt)

    def finalize(self, sequence: int, at: int) -> None:
        if self.status == "cancelling":
            return  # a cancel came first, and decides: the finalizer ends the batch `cancelled` (a race, not a fault)
        if not self.refuses(sequence, "finalizing", self.status, ("in_progress",)):
            self._finalizing(sequence, at)

    @event("Finalizing")
    def _finalizing(self, sequence: int, at: int) -> None:
        self._stop_running()
        self.last_sequence, self.status = sequence, "finalizing"
        self.times["finalizing_at"] = at

    def complete(self, sequence: int, at: int, output_file_id: str | None, error_file_id: str | None,
                 completed: int, failed: int, usage: dict[str, Any]) -> None:
        if not self.refuses(sequence, "completed", self.status, IN_FLIGHT):
            self._completed(sequence, at, output_file_id, error_file_id, completed, failed, usage)

    @event("Completed")
    def _completed(self, sequence: int, at: int, output_file_id: str | None, error_file_id: str | None,
                   completed: int, failed: int, usage: dict[str, Any]) -> None:
        self._end_with(sequence, at, "completed", output_file_id, error_file_id, completed, failed, usage)

    def fail(self, sequence: int, at: int, code: str, reason: str, ended: dict[str, Any] | None = None) -> None:
        """Failed, with its cause in `errors.data`; `ended` (files, counts, usage) when it was finalized first."""
        if not self.refuses(sequence, "failed", self.status, UNFINISHED):
            self._failed(sequence, at, code, reason, ended)

    @event("Failed")
    def _failed(self, sequence: int, at: int, code: str, reason: str, ended: dict[str, Any] | None = None) -> None:
        # Stored Failed events from before `ended` fold with the default: a failure without files.
        self.last_sequence, self.status, self.status_reason = sequence, "failed", reason
        self.failure_code = code
        self.times["failed_at"] = at
        self._forget_chunks()
        self._note_error(code, reason)
        if ended is not None:
            self.output_file_id, self.error_file_id = ended["output_file_id"], ended["error_file_id"]
            self.completed, self.failed, self.usage = ended["completed"], ended["failed"], ended["usage"]

    def release(self, sequence: int) -> None:
        if not getattr(self, "held", False):
            self.note_anomaly(sequence, "released", "the batch was not held")
        elif not self.refuses(sequence, "released", self.status, RELEASABLE | {"cancelling"}):
            self._released(sequence)

    @event("Released")
    def _released(self, sequence: int) -> None:
        self.last_sequence, self.held = sequence, False

    def wait(self, sequence: int, reason: str) -> None:
        """Where the batch stands: why it waits while queued, how far it is while running; the status stays."""
        if self.has_folded(sequence) or self.status in STANDING_TOO_LATE:
            return  # judged on a view from before the batch moved on: a race, not a fault; nothing left to say
        if not self.refuses(sequence, "waiting", self.status, ("validated", "in_progress")):
            self._waiting(sequence, reason)

    @event("Waiting")
    def _waiting(self, sequence: int, reason: str) -> None:
        self.last_sequence, self.status_reason = sequence, reason

    def _stop_running(self) -> None:
        """A running batch's standing ("Running on 2 executors: …") ends with the running. (Stored histories
        never had a reason while in_progress, so they fold as they did.)"""
        if self.status == "in_progress":
            self.status_reason = None

    def fail_attempt(self, sequence: int, attempt: int, executor_id: str, code: str, reason: str) -> None:
        if not self.refuses(sequence, "attempt_failed", self.status, IN_FLIGHT | {"validated"}):
            self._attempt_failed(sequence, attempt, executor_id, code, reason)

    @event("AttemptFailed")
    def _attempt_failed(self, sequence: int, attempt: int, executor_id: str, code: str, reason: str) -> None:
        self.last_sequence = sequence
        self.attempt_failures.append({"sequence": sequence, "attempt": attempt, "executor_id": executor_id,
                                      "code": code, "reason": reason})
        if code not in BATCH_ENDS:
            # A run-time failure shows in the batch's own errors too (InferNode's users read them there).
            self._note_error(code, f"Attempt {attempt} on executor {executor_id} ended: {reason}")
        if self._close_attempt(attempt) and self.status in RUNNING:
            # Back in the queue (no shard runs) until the scheduler assigns a later attempt.
            self.status, self.status_reason = "validated", reason

    def request_cancel(self, sequence: int, at: int, key_id: str, by_admin: str | None = None,
                       by_admin_message: str | None = None) -> None:
        if not self.refuses(sequence, "cancel_requested", self.status, CANCELLABLE):
            self._cancel_requested(sequence, at, key_id, by_admin, by_admin_message)

    @event("CancelRequested")
    def _cancel_requested(self, sequence: int, at: int, key_id: str, by_admin: str | None = None,
                          by_admin_message: str | None = None) -> None:
        # Stored CancelRequested events from before administrators cancelled fold with the defaults.
        self._stop_running()
        self.last_sequence, self.status, self.cancel_requested_by = sequence, "cancelling", key_id
        self.times["cancelling_at"] = at
        if by_admin is not None:
            # Someone other than the owner: the batch says who (InferNode's `cancelled_by_org_admin`/`…platform_admin`).
            self._note_error(by_admin, by_admin_message or by_admin)

    def _note_error(self, code: str, message: str, line: int | None = None, param: str | None = None) -> None:
        """An entry of the batch's `errors`: about one line, or (no line) the whole batch."""
        if len(self.errors) < ERRORS_KEPT:  # each clipped as a rejected line's is: the record must stay small
            self.errors.append({"code": code, "line": line, "message": clipped(message, ISSUE_MESSAGE_CHARS),
                                "param": None if param is None else clipped(param, ISSUE_PARAM_CHARS)})
        self.error_total += 1
        self.counts_by_code[code] = self.counts_by_code.get(code, 0) + 1

    def end(self, sequence: int, at: int, status: str, output_file_id: str | None, error_file_id: str | None,
            completed: int, failed: int, usage: dict[str, Any]) -> None:
        """Cancelled (only once requested) or expired (from any unfinished status), with what was done."""
        allowed = {"cancelling"} if status == "cancelled" else UNFINISHED
        if not self.refuses(sequence, status, self.status, allowed):
            self._ended(sequence, at, status, output_file_id, error_file_id, completed, failed, usage)

    @event("Ended")
    def _ended(self, sequence: int, at: int, status: str, output_file_id: str | None, error_file_id: str | None,
               completed: int, failed: int, usage: dict[str, Any]) -> None:
        self._end_with(sequence, at, status, output_file_id, error_file_id, completed, failed, usage)

    def _end_with(self, sequence: int, at: int, status: str, output_file_id: str | None, error_file_id: str | None,
                  completed: int, failed: int, usage: dict[str, Any]) -> None:
        """Completed, cancelled or expired, with its files, final counts and usage."""
        self._stop_running()
        self.last_sequence, self.status = sequence, status
        self.output_file_id, self.error_file_id = output_file_id, error_file_id
        self.completed, self.failed, self.usage = completed, failed, usage
        self.times[f"{status}_at"] = at
        self._forget_chunks()
