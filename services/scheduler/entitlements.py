"""Who may state which fact, and read which batch's log: the fact desk's judgement, on the leader's book alone. An
attempt's facts come from its assignee; a batch's end and files from its finalizer (the one running its only shard,
or the one last sent the finalize command). A fact naming another owner or object is refused, never corrected;
whether the attempt still holds its lease is fenced by the conditional publish."""

import re
from collections.abc import Callable
from typing import TypeVar

from contracts.api.file import RESULT_FILE_EXPIRES_AFTER_S
from contracts.api.request_line import MAX_SAMPLES
from contracts.catalogue import SHA256_HEX
from contracts.events.batch import (
    AttemptFailed,
    BatchEnded,
    BatchFailed,
    BatchFinalizing,
    BatchProgressed,
    BatchStarted,
    ShardFinished,
)
from contracts.events.envelope import Event
from contracts.events.file import FileStored
from contracts.ids import error_file_id, output_file_id, result_file_name
from contracts.subjects import input_object_key, parse_result_chunk_key
from services.scheduler.book import BatchPlan, Book
from services.scheduler.plans import progress_statement

AttemptFact = BatchStarted | BatchProgressed | ShardFinished | AttemptFailed
FinalizerFact = BatchEnded | BatchFailed
StatedFact = TypeVar("StatedFact", bound=Event)
ContextLength = Callable[[str], int | None] | None
"""A model's context length by catalogue id (None: not in the catalogue)."""


def finalizes(plan: BatchPlan, executor_id: str) -> bool:
    """Whether `executor_id` may write this batch's files and state its end."""
    if plan.finalizer == executor_id:
        return True
    one_shard = plan.layout is None or plan.layout.shards == 1
    latest = plan.shards.get(0)
    # Its own single unit, while its lease holds: once fenced, the control plane ends it (a fact without the fence
    # must not slip past it).
    return one_shard and latest is not None and latest.attempt not in latest.failed_attempts \
        and plan.assignees.get(latest.attempt) == executor_id


def may_read(book: Book, executor_id: str, batch_id: str) -> str | None:
    """None when `executor_id` (an assignee or the finalizer) may read the batch's execution facts; else why not."""
    plan = book.plans.get(batch_id)
    if plan is None:
        forgotten = book.forgotten.get(batch_id)  # ended long ago: what it had may still read how
        return None if forgotten is not None and executor_id in forgotten.executors else f"batch {batch_id} is unknown"
    if executor_id in plan.assignees.values() or finalizes(plan, executor_id):
        return None
    return f"executor {executor_id} was assigned no attempt of batch {batch_id} and does not finalize it"


def superseded(book: Book, event: Event) -> bool:
    """An attempt's fact after it was fenced (failed, or its shard leased again): never stored, fence or no fence
    (a stale executor is told the fence moved)."""
    attempt = getattr(event, "attempt", 0)
    plan = book.plans.get(event.aggregate_id) if event.kind == "batch" and attempt else None
    if plan is None:
        return False
    run = plan.shards.get(plan.attempt_shard.get(attempt, 0))
    return run is not None and (attempt in run.failed_attempts or run.attempt > attempt)


UNKNOWN_CONTEXT = 2**24
"""The context a line is taken to have when the catalogue names none for its model: 16M tokens, past any model's,
so a batch's sums stay far within what every reader (an orjson writer: 64 bits) takes."""
STATED_CODE = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)*")
"""How every failure code is spelt (`engine_error`, `storage_unavailable`): never an arbitrary key of a batch's
counts by code."""


def may_state(book: Book, executor_id: str, event: Event, context_length: ContextLength = None) -> str | None:
    """None when `executor_id` may state `event`; else why not. `context_length` bounds the tokens a line can use."""
    if isinstance(event, FileStored):
        return _may_store(book, executor_id, event)
    plan = book.plans.get(event.aggregate_id) if event.kind == "batch" else None
    if plan is None:
        return f"{event.type} of {event.aggregate_id}: not a fact of a batch this scheduler knows"
    if isinstance(event, AttemptFailed | BatchFailed) and not (len(event.code) <= 64
                                                               and STATED_CODE.fullmatch(event.code)):
        return f"{event.type} states the code {event.code[:80]!r}: codes are lower-case words joined by '_'"
    context = context_length(plan.model) if context_length is not None and plan.model else None
    if isinstance(event, AttemptFact):
        return _attempt_refusal(plan, executor_id, event) or _count_refusal(plan, event, context)
    if isinstance(event, BatchFinalizing) and event.attempt:
        return _attempt_refusal(plan, executor_id, event) or _finalizer_refusal(plan, executor_id, event)
    if isinstance(event, BatchFinalizing | FinalizerFact):
        return _finalizer_refusal(plan, executor_id, event) or _count_refusal(plan, event, context)
    return f"{event.type} is not a fact executors state"


def _count_refusal(plan: BatchPlan, event: Event, context: int | None) -> str | None:
    """Counts never past the unit's (or batch's) lines, and tokens never past what the new lines can use (prompt
    and up to `MAX_SAMPLES` completions within the model's context)."""
    if isinstance(event, BatchProgressed):
        announced = plan.announced.get(event.chunk_key)
        if announced is not None:  # a repeat (a retried submission): the log and the ledger dedup it
            return None if announced == progress_statement(event) else (
                f"{event.chunk_key} was announced already, stating other counts or tokens")
        unit = plan.attempt_shard.get(event.attempt, event.shard)
        limit = plan.unit_lines(unit) if plan.layout is not None else plan.total_lines
        counted = event.completed + event.failed
        new_lines = counted - plan.unit_done.get(unit, 0)
        where = f"unit {unit} of {plan.batch_id}"
    elif isinstance(event, BatchEnded | BatchFailed):
        limit = plan.total_lines
        counted = new_lines = (event.completed or 0) + (event.failed or 0)
        where = plan.batch_id
    else:
        return None
    if counted > limit:
        return f"{event.type} counts {counted} lines, but {where} has {limit}"
    usage = event.usage
    if min(getattr(event, "completed", 0) or 0, getattr(event, "failed", 0) or 0) < 0 or (usage is not None and min(
            usage.input_tokens, usage.output_tokens, usage.input_tokens_details.cached_tokens) < 0):
        return f"{event.type} states a negative count"
    if usage is not None and (usage.total_tokens != usage.input_tokens + usage.output_tokens
                              or not 0 <= usage.output_tokens_details.reasoning_tokens <= usage.output_tokens
                              or usage.input_tokens_details.cached_tokens > usage.input_tokens):
        return (f"{event.type} states tokens that do not add up: {usage.input_tokens} + {usage.output_tokens} is "
                f"not {usage.total_tokens}, or reasoning or cached tokens are not within what they are part of")
    if usage is None:
        return None
    context = context or UNKNOWN_CONTEXT  # a model the catalogue does not bound: its lines are bounded still
    lines = max(new_lines, 0) if isinstance(event, BatchProgressed) else limit
    if usage.input_tokens > lines * context or usage.output_tokens > lines * MAX_SAMPLES * context \
            or usage.input_tokens_details.cached_tokens > usage.input_tokens:
        return (f"{event.type} states {usage.input_tokens} prompt and {usage.output_tokens} completion tokens for "
                f"{lines} lines of {where}: more than lines of a {context}-token context can use")
    return None


def _attempt_refusal(plan: BatchPlan, executor_id: str, event: AttemptFact | BatchFinalizing) -> str | None:
    assignee = plan.assignees.get(event.attempt)
    if assignee != executor_id:
        return f"attempt {event.attempt} of {plan.batch_id} was not assigned to executor {executor_id}"
    named = getattr(event, "executor_id", executor_id)
    if named != executor_id:
        return f"{event.type} names executor {named}, but executor {executor_id} states it"
    shard = plan.attempt_shard.get(event.attempt, 0)
    if isinstance(event, BatchProgressed | ShardFinished) and event.shard != shard:
        return f"attempt {event.attempt} of {plan.batch_id} runs unit {shard}, not {event.shard}"
    if isinstance(event, BatchProgressed):
        chunk = parse_result_chunk_key(event.chunk_key)
        if chunk != (plan.batch_id, event.attempt, event.chunk):
            return f"{event.chunk_key} is not chunk {event.chunk} of attempt {event.attempt} of {plan.batch_id}"
        lines = plan.unit_lines(shard)
        if not 0 <= event.chunk < lines:  # each chunk commits at least one line (as the object broker signs them)
            return f"attempt {event.attempt} of {plan.batch_id} runs {lines} lines: it has no chunk {event.chunk}"
    return None


def _finalizer_refusal(plan: BatchPlan, executor_id: str, event: BatchFinalizing | FinalizerFact) -> str | None:
    if not finalizes(plan, executor_id):
        return f"executor {executor_id} does not finalize batch {plan.batch_id}"
    if isinstance(event, BatchEnded | BatchFailed):
        if event.output_file_id not in (None, output_file_id(plan.batch_id)):
            return f"{event.output_file_id} is not the output file of {plan.batch_id}"
        if event.error_file_id not in (None, error_file_id(plan.batch_id)):
            return f"{event.error_file_id} is not the error file of {plan.batch_id}"
    return None


def clamped(event: StatedFact, now_ms: int, since_ms: int = 0) -> StatedFact:
    """The fact as the desk stores it: its `occurred_at` (a file's `created_at` too) never past the desk's clock nor
    before `since_ms` (its batch's creation); a file's time moved keeps its lifetime, so it never expires later than
    that lifetime from now, nor sooner than that lifetime after its batch was created."""
    update: dict[str, object] = {}
    if not since_ms <= event.occurred_at <= now_ms:
        update["occurred_at"] = min(max(event.occurred_at, since_ms), now_ms)
    if isinstance(event, FileStored):
        created = min(max(event.created_at, since_ms // 1000), now_ms // 1000)
        if created != event.created_at:
            update["created_at"] = created
            if event.expires_at is not None:
                update["expires_at"] = event.expires_at + (created - event.created_at)
    return event.model_copy(update=update) if update else event


def batch_created_ms(book: Book, event: StatedFact) -> int:
    """When the batch `event` is of was created (ms), as its terms say; 0 when the book does not know it."""
    batch_id = event.batch_id if isinstance(event, FileStored) else event.aggregate_id
    plan = book.plans.get(batch_id) if batch_id else None
    return plan.terms.created_at * 1000 if plan is not None else 0


def _may_store(book: Book, executor_id: str, event: FileStored) -> str | None:
    """Only the output and error file of a batch it finalizes, as its owner's, within its lines and lifetime."""
    batch_id = event.batch_id
    plan = book.plans.get(batch_id) if batch_id else None
    if plan is None:
        return f"file {event.aggregate_id} names no batch this scheduler knows"
    if event.aggregate_id not in (output_file_id(plan.batch_id), error_file_id(plan.batch_id)):
        return f"file {event.aggregate_id} is not the output or error file of {plan.batch_id}"
    if event.purpose != "batch_output":
        return f"a batch's result file has purpose batch_output, not {event.purpose}"
    name = result_file_name(plan.batch_id, "output" if event.aggregate_id == output_file_id(plan.batch_id) else "error")
    if event.filename != name:
        return f"file {event.aggregate_id} is named {name}, not {event.filename[:80]!r}"
    if event.object_key != input_object_key(event.aggregate_id):
        return f"file {event.aggregate_id} lies under its own key, not {event.object_key}"
    if event.owner_key_id != plan.terms.owner_key_id:
        return f"file {event.aggregate_id} belongs to the owner of {plan.batch_id}, not {event.owner_key_id}"
    if not finalizes(plan, executor_id):
        return f"executor {executor_id} does not finalize batch {plan.batch_id}"
    if not SHA256_HEX.fullmatch(event.sha256):
        return f"file {event.aggregate_id} states {event.sha256[:80]!r} as its SHA-256, not 64 hex digits"
    if not 0 <= (event.line_count or 0) <= plan.total_lines or event.bytes < 0:
        return f"file {event.aggregate_id} states {event.line_count} lines; {plan.batch_id} has {plan.total_lines}"
    lifetime = plan.terms.output_expires_after_s or RESULT_FILE_EXPIRES_AFTER_S
    if event.expires_at is None or event.expires_at - event.created_at != lifetime:
        return f"file {event.aggregate_id} must expire the {lifetime} s after it is stored that its batch asked for"
    return None
