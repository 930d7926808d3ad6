"""`GET /v1/batches/{id}/results` (extension): the output lines a batch has committed so far, paged in the order their
chunks were announced by `batch.progressed` facts (exactly the output file's lines). `after` is the previous page's
opaque `next_after`; `complete` says the batch ended and this page reached its last line."""

from typing import Literal

from aiohttp import web
from pydantic import BaseModel

from contracts.api.output_line import OutputLine
from contracts.events.batch import BatchProgressed
from contracts.events.registry import decode_event
from contracts.lifecycle import TERMINAL
from contracts.subjects import event_subject
from services.gateway.context import deps
from services.gateway.http.auth import principal
from services.gateway.http.bodies import answer
from services.gateway.http.paging import limit_of
from services.gateway.usecases.batches import overseen_batch
from services.gateway.usecases.refusals import ascii_int, bad_request
from services.runtime.nats import eventlog

DEFAULT_LIMIT, MAX_LIMIT = 100, 1000
CURSOR_PATTERN = r"^[0-9]{1,20}\.[0-9]{1,19}$"
"""A page's `next_after`: the sequence of a chunk's fact, a dot, the lines of that chunk already given."""


class ResultsPage(BaseModel):
    object: Literal["list"] = "list"
    data: list[OutputLine]
    first_id: str | None
    last_id: str | None
    has_more: bool
    """More lines are committed past this page (ask again with `after=next_after`)."""
    next_after: str | None
    """Where the next page starts; None with an empty page (ask again with the same `after` later)."""
    complete: bool
    """The batch has ended and no line is left after this page: these are its output file's lines, all of them."""


def _cursor(raw: str | None) -> tuple[int, int]:
    """(sequence of the chunk's fact, lines of that chunk already returned); (0, 0): from the first."""
    if raw is None:
        return 0, 0
    sequence, dot, index = raw.partition(".")
    at, skipped = ascii_int(sequence, 20), ascii_int(index, 19)
    if not dot or at is None or skipped is None:
        raise bad_request("after must be the next_after of an earlier page of results.", "invalid_after", "after")
    return at, skipped


async def batch_results(request: web.Request) -> web.Response:
    d = deps(request)
    record, _ = await overseen_batch(d, principal(request), request.match_info["batch_id"])
    ended = record.batch.status in TERMINAL
    start_sequence, skip = _cursor(request.query.get("after"))
    limit = limit_of(request.query.get("limit"), DEFAULT_LIMIT, MAX_LIMIT)
    data: list[OutputLine] = []
    seen_lines: set[int] = set()
    next_after: str | None = None
    has_more = False
    subject = event_subject("batch", record.batch.id, "progressed")
    async for fact in eventlog.read(d.bus, subject, after=max(start_sequence - 1, 0)):
        event = decode_event(fact.data)
        if not isinstance(event, BatchProgressed):
            continue
        lines = await d.result_chunks.lines(d.store.iter_chunks, event.chunk_key)
        succeeded = [line for line in lines if line.succeeded]
        first = skip if fact.sequence == start_sequence else 0
        for index, line in enumerate(succeeded[first:], start=first):
            if line.line in seen_lines:
                continue
            if len(data) == limit:
                has_more = True
                break
            seen_lines.add(line.line)
            data.append(line.output)
            next_after = f"{fact.sequence}.{index + 1}"
        if has_more:
            break
    if next_after is None and start_sequence:
        next_after = f"{start_sequence}.{skip}"  # nothing new yet: the same place
    return answer(ResultsPage(data=data, first_id=data[0].id if data else None, last_id=data[-1].id if data else None,
                              has_more=has_more, next_after=next_after, complete=ended and not has_more))

