"""A batch's audit timeline: one row per fact of its log, with who acted, on which attempt, model and engine."""

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime

from contracts.events.batch import (
    AttemptFailed,
    BatchAssigned,
    BatchCancelled,
    BatchCancelRequested,
    BatchCompleted,
    BatchCreated,
    BatchExpired,
    BatchFailed,
    BatchProgressed,
    BatchStarted,
    BatchValidated,
    BatchValidationFailed,
    BatchWaiting,
    LineRejected,
)
from contracts.events.envelope import Event
from services.ledger.application import Ledger, persistence_env
from services.runtime.nats.foldrules import FoldRules


@dataclass
class Row:
    time: str
    sequence: int
    type: str
    actor: str | None
    attempt: int | None
    model: str | None
    engine: str | None
    """Engine and its version, as `llamacpp 0.3.1`."""
    counts: str | None
    note: str | None
    """What else an auditor needs: a reason, a line number, or the anomaly the ledger recorded."""


@dataclass
class _Story:
    """What earlier facts of the batch tell the rows after them."""

    model: str | None = None
    engines: dict[int, str] = field(default_factory=dict)
    """Attempt → `engine version`, from its start."""


_describe = FoldRules[None]()
"""How each fact fills in its row (and the story); facts without a rule show only the envelope's columns."""


def _when(occurred_at_ms: int) -> str:
    """A fact's time as ISO 8601; one no calendar holds (a time stated before the desk bounded them) as its ms."""
    try:
        return datetime.fromtimestamp(occurred_at_ms / 1000, UTC).isoformat(timespec="milliseconds")
    except (OverflowError, ValueError, OSError):
        return f"{occurred_at_ms} ms"


def timeline(facts: Sequence[tuple[int, Event]]) -> list[Row]:
    """Rows for a batch's facts in stream order; anomalies come from folding them into a scratch ledger."""
    scratch = Ledger(persistence_env(None))
    try:
        scratch.fold(facts)
        batch = scratch.batch(facts[0][1].aggregate_id) if facts else None
        anomalies = {a["sequence"]: a["reason"] for a in batch.anomalies} if batch else {}
    finally:
        scratch.close()
    rows: list[Row] = []
    story = _Story()
    for sequence, fact in facts:
        row = Row(time=_when(fact.occurred_at),
                  sequence=sequence, type=fact.type, actor=None, attempt=getattr(fact, "attempt", None),
                  model=story.model, engine=None, counts=None, note=None)
        rule = _describe.rule_for(type(fact))
        if rule is not None:
            rule(row, fact, story)
        if row.attempt is not None:
            row.engine = story.engines.get(row.attempt)
        if sequence in anomalies:
            row.note = f"ANOMALY: {anomalies[sequence]}"
        rows.append(row)
    return rows


@_describe.on(BatchCreated)
def _created(row: Row, fact: BatchCreated, story: _Story) -> None:
    row.actor, row.note = fact.terms.owner_key_id, f"input {fact.input_file_id}, {fact.terms.endpoint}"


@_describe.on(LineRejected)
def _line_rejected(row: Row, fact: LineRejected, story: _Story) -> None:
    row.note = f"line {fact.line}: {fact.code}"


@_describe.on(BatchValidated)
def _validated(row: Row, fact: BatchValidated, story: _Story) -> None:
    story.model = row.model = fact.model
    row.counts = f"total={fact.total_lines}" + (f" refused={fact.rejected_lines} errors={fact.error_count}"
                                                if fact.error_count else "")


@_describe.on(BatchValidationFailed)
def _validation_failed(row: Row, fact: BatchValidationFailed, story: _Story) -> None:
    row.counts = f"total={fact.total_lines} errors={fact.error_count}" + (
        f" refused={fact.rejected_lines}" if fact.rejected_lines is not None else "")


@_describe.on(BatchAssigned, BatchStarted)
def _ran(row: Row, fact: BatchAssigned | BatchStarted, story: _Story) -> None:
    row.actor = fact.executor_id
    if isinstance(fact, BatchStarted):
        story.engines[fact.attempt] = f"{fact.engine} {fact.engine_version}"


@_describe.on(BatchProgressed)
def _progressed(row: Row, fact: BatchProgressed, story: _Story) -> None:
    row.counts = f"completed={fact.completed} failed={fact.failed}"


@_describe.on(AttemptFailed, BatchFailed)
def _failed(row: Row, fact: AttemptFailed | BatchFailed, story: _Story) -> None:
    row.note = f"{fact.code}: {fact.reason}"
    if isinstance(fact, AttemptFailed):
        row.actor = fact.executor_id


@_describe.on(BatchWaiting)
def _waiting(row: Row, fact: BatchWaiting, story: _Story) -> None:
    row.note = fact.reason


@_describe.on(BatchCancelRequested)
def _cancel_requested(row: Row, fact: BatchCancelRequested, story: _Story) -> None:
    row.actor = fact.requested_by_key_id


@_describe.on(BatchCompleted, BatchCancelled, BatchExpired)
def _ended(row: Row, fact: BatchCompleted | BatchCancelled | BatchExpired, story: _Story) -> None:
    usage = fact.usage
    row.counts = (f"completed={fact.completed} failed={fact.failed} tokens in={usage.input_tokens} "
                  f"cached={usage.input_tokens_details.cached_tokens} out={usage.output_tokens}")


def render_table(rows: list[Row]) -> str:
    cells = [[column.name for column in fields(Row)]]
    cells += [["" if v is None else str(v) for v in asdict(row).values()] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(cells[0]))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
                     for line in cells)
