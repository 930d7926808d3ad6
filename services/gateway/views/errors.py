"""`GET /v1/batches/{id}/errors` (extension): the batch's errors grouped by code, with a fix for each. Counts from the
batch, examples from its `line_rejected` facts; once ended, its error file's lines counted by code and stage (the
same number as `request_counts.failed`), kept for a bounded number of files (an error file never changes)."""

import contextlib
from collections import Counter, OrderedDict

import orjson
from aiohttp import web

from contracts.api.batch import Batch
from contracts.api.error_codes import BatchErrorSummary, ErrorGroup, FailedLineGroup, FailureStage, help_for
from contracts.events.batch import LineRejected
from contracts.events.registry import decode_event
from contracts.lifecycle import TERMINAL
from contracts.subjects import event_subject
from services.gateway.context import Deps, deps
from services.gateway.http.auth import principal
from services.gateway.http.bodies import answer
from services.gateway.usecases.batches import owned_batch
from services.gateway.usecases.retry import failure_code
from services.runtime.nats import eventlog
from services.runtime.nats.bus import EventBus

LINES_PER_GROUP = 5
COUNTS_KEPT = 256
"""Error files whose counts one gateway keeps."""
_counted: OrderedDict[str, list[FailedLineGroup]] = OrderedDict()


async def rejected_lines(bus: EventBus, batch_id: str) -> list[LineRejected]:
    """Every `line_rejected` fact of the batch, read to the log's head without a consumer."""
    facts = eventlog.read(bus, event_subject("batch", batch_id, LineRejected.name))
    return [event for event in [decode_event(fact.data) async for fact in facts] if isinstance(event, LineRejected)]


def summarise(batch: Batch, rejected: list[LineRejected]) -> BatchErrorSummary:
    counts = dict(batch.errors.counts_by_code) if batch.errors else {}
    for event in rejected:
        counts.setdefault(event.code, 0)
    groups: list[ErrorGroup] = []
    for code in sorted(counts, key=lambda c: (-counts[c], c)):
        examples = [event for event in rejected if event.code == code]
        guide = help_for(code)
        groups.append(ErrorGroup(
            code=code, count=counts[code] or len(examples),
            lines=[e.line for e in examples if e.line is not None][:LINES_PER_GROUP],
            param=examples[0].param if examples else None,
            example_message=examples[0].message if examples else guide.title,
            title=guide.title, fix=guide.fix))
    total = batch.errors.total if batch.errors and batch.errors.total else sum(g.count for g in groups)
    return BatchErrorSummary(batch_id=batch.id, total=total, groups=groups)


def stage_of(row: dict[str, object]) -> FailureStage:
    if isinstance(row.get("line"), int):
        return "refused"
    return "ran" if row.get("response") is not None else "not_run"


async def failed_by_code(request: web.Request, error_file_id: str) -> list[FailedLineGroup] | None:
    """The error file's lines by code and why, largest first; None when the file is gone. Requests asking at once
    share one read of the file."""
    if error_file_id in _counted:
        _counted.move_to_end(error_file_id)
        return _counted[error_file_id]
    d = deps(request)
    record = await d.read_model.get_file(error_file_id)
    if record is None or record.deleted:
        return None
    groups = await d.shared_reads.read(("failed_by_code", error_file_id), lambda: _counted_lines(d, record.object_key))
    _counted[error_file_id] = groups
    while len(_counted) > COUNTS_KEPT:
        _counted.popitem(last=False)
    return groups


async def _counted_lines(d: Deps, object_key: str) -> list[FailedLineGroup]:
    counts: Counter[tuple[str, FailureStage]] = Counter()
    async with contextlib.aclosing(d.store.iter_lines(object_key)) as lines:
        async for raw in lines:
            if raw.strip():
                row = orjson.loads(raw)
                counts[(failure_code(row) or "unknown", stage_of(row))] += 1
    return [FailedLineGroup(code=code, stage=stage, count=count, title=help_for(code).title)
            for (code, stage), count in sorted(counts.items(), key=lambda item: (-item[1], item[0]))]


async def batch_errors(request: web.Request) -> web.Response:
    batch = (await owned_batch(deps(request), principal(request), request.match_info["batch_id"])).batch
    summary = summarise(batch, await rejected_lines(deps(request).bus, batch.id))
    if batch.status in TERMINAL and batch.error_file_id:
        groups = await failed_by_code(request, batch.error_file_id)
        if groups is not None:
            summary = summary.model_copy(update={"failed_lines": sum(g.count for g in groups),
                                                 "failed_by_code": groups})
    return answer(summary)
