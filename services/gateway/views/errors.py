"""`GET /v1/batches/{id}/errors` (extension): the batch's errors grouped by code, with a fix for each.

True counts come from the batch; line numbers and examples from the batch's `line_rejected` facts in the log
(the validator publishes the first errors of every code, so each group has examples).
"""

from aiohttp import web

from contracts.api.batch import Batch
from contracts.api.error_codes import BatchErrorSummary, ErrorGroup, help_for
from contracts.events.batch import LineRejected
from contracts.events.registry import decode_event
from contracts.subjects import event_subject
from services.gateway.context import deps
from services.gateway.views.batches import owned_batch
from services.runtime import eventlog
from services.runtime.bus import EventBus

LINES_PER_GROUP = 5


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


async def batch_errors(request: web.Request) -> web.Response:
    record = await owned_batch(request, request.match_info["batch_id"])
    rejected = await rejected_lines(deps(request).bus, record.batch.id)
    return web.json_response(summarise(record.batch, rejected).model_dump(mode="json"))
