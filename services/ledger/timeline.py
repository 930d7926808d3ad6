"""A batch's audit timeline: one row per fact of its log, with who acted, on which attempt, model and engine."""

from collections.abc import Sequence
from dataclasses import asdict, dataclass
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
    BatchFinalizing,
    BatchProgressed,
    BatchStarted,
    BatchValidated,
    BatchValidationFailed,
    BatchWaiting,
    LineRejected,
)
from contracts.events.envelope import Event
from services.ledger.application import Ledger, persistence_env

COLUMNS = ("time", "sequence", "type", "actor", "attempt", "model", "engine", "counts", "note")


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

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


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
    model: str | None = None
    engines: dict[int, str] = {}
    for sequence, fact in facts:
        row = Row(time=datetime.fromtimestamp(fact.occurred_at / 1000, UTC).isoformat(timespec="milliseconds"),
                  sequence=sequence, type=fact.type, actor=None, attempt=getattr(fact, "attempt", None),
                  model=model, engine=None, counts=None, note=None)
        match fact:
            case BatchCreated():
                row.actor, row.note = fact.owner_key_id, f"input {fact.input_file_id}, {fact.endpoint}"
            case LineRejected():
                row.note = f"line {fact.line}: {fact.code}"
            case BatchValidated():
                model = row.model = fact.model
                row.counts = f"total={fact.total_lines}" + (f" refused={fact.rejected_lines} errors={fact.error_count}"
                                                            if fact.error_count else "")
            case BatchValidationFailed():
                row.counts = f"total={fact.total_lines} errors={fact.error_count}" + (
                    f" refused={fact.rejected_lines}" if fact.rejected_lines is not None else "")
            case BatchAssigned():
                row.actor = fact.executor_id
            case BatchStarted():
                row.actor = fact.executor_id
                engines[fact.attempt] = f"{fact.engine} {fact.engine_version}"
            case BatchProgressed():
                row.counts = f"completed={fact.completed} failed={fact.failed}"
            case AttemptFailed():
                row.actor, row.note = fact.executor_id, f"{fact.code}: {fact.reason}"
            case BatchWaiting():
                row.note = fact.reason
            case BatchCancelRequested():
                row.actor = fact.requested_by_key_id
            case BatchCompleted() | BatchCancelled() | BatchExpired():
                usage = fact.usage
                row.counts = (f"completed={fact.completed} failed={fact.failed} tokens in={usage.input_tokens} "
                              f"cached={usage.input_tokens_details.cached_tokens} out={usage.output_tokens}")
            case BatchFailed():
                row.note = f"{fact.code}: {fact.reason}"
            case BatchFinalizing():
                pass
        if row.attempt is not None:
            row.engine = engines.get(row.attempt)
        if sequence in anomalies:
            row.note = f"ANOMALY: {anomalies[sequence]}"
        rows.append(row)
    return rows


def render_table(rows: list[Row]) -> str:
    cells = [list(COLUMNS)] + [["" if v is None else str(v) for v in row.as_dict().values()] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
                     for line in cells)
