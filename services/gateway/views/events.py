"""`GET /v1/batches/{id}/events`: the batch's facts as Server-Sent Events in their public shape, resumable by sequence,
ending with the batch; read in order with no gap by the one log reader (`eventlog.follow`), or from the archived
log of a batch purged from the stream."""

import asyncio
import contextlib
import logging
import time
import zlib
from collections.abc import AsyncGenerator, AsyncIterator

import nats.errors
import nats.js.errors
from aiohttp import web
from nats.js import JetStreamContext

from contracts.api.error import ErrorResponse
from contracts.archive import archived_batch_log_key, parse_fact_line
from contracts.lifecycle import ENDING_FACT_NAMES, TERMINAL
from contracts.readmodel import BatchRecord
from contracts.subjects import batch_events, event_name_of, event_subject
from services.gateway.context import deps
from services.gateway.http.auth import principal, still_authorized
from services.gateway.http.errors import client_gone
from services.gateway.http.event_frames import sse_frame
from services.gateway.http.transfer_slots import OPEN_STREAMS
from services.gateway.usecases.batches import owned_batch
from services.gateway.usecases.refusals import ascii_int, bad_request, revoked_key
from services.runtime.nats import eventlog
from services.runtime.nats.eventlog import Fact
from services.runtime.nats.facts import last_sequence
from services.runtime.storage.objectstore import ObjectNotFound, ObjectStore

log = logging.getLogger(__name__)

HEARTBEAT_S = 15.0
REVOCATION_CHECK_S = 2.0
"""How often an open stream checks that its key was not revoked since: a revoked key's streams end this soon."""
POLL_S = 1.0
"""How often an idle stream looks whether its client is still there (the reader's wait at the stream's head)."""
FACTS_PER_READ = 256
MAX_SEQUENCE = 2**63 - 1
"""Stream sequences are 64-bit; a resume point past this names no event."""
REVOKED_FRAME = b"event: error\ndata: %s\n\n" % ErrorResponse(error=revoked_key().body).model_dump_json().encode()
"""The last frame of a stream whose key was revoked while it ran (in OpenAI's error shape); the stream then ends."""


def resume_after(request: web.Request) -> int:
    raw = (request.headers.get("Last-Event-ID") or request.query.get("last_event_id") or "0").strip()
    sequence = ascii_int(raw, 20)
    if sequence is None or sequence > MAX_SEQUENCE:
        raise bad_request("Last-Event-ID must be the integer id of an event already received.",
                          "invalid_last_event_id", "Last-Event-ID")
    return sequence


async def terminal_sequence(js: JetStreamContext, batch_id: str) -> int | None:
    """Where the batch's terminal fact is in the stream; None while it runs, or once its log left the stream."""
    sequences = await asyncio.gather(*(last_sequence(js, event_subject("batch", batch_id, name))
                                       for name in sorted(ENDING_FACT_NAMES)))
    return min((seq for seq in sequences if seq is not None), default=None)


async def archived_frames(store: ObjectStore, batch_id: str, after: int) -> AsyncGenerator[bytes, None]:
    """The frames of an archived batch's facts after `after`, streamed from its log (`ObjectNotFound`: no log)."""
    unzip, pending = zlib.decompressobj(31), b""
    async with contextlib.aclosing(store.iter_chunks(archived_batch_log_key(batch_id))) as chunks:
        async for chunk in chunks:
            *lines, pending = (pending + unzip.decompress(chunk)).split(b"\n")
            for line in lines:
                sequence, _, data = parse_fact_line(line)
                frame = sse_frame(sequence, data) if sequence > after else None
                if frame is not None:
                    yield frame


async def _archived(request: web.Request, response: web.StreamResponse, batch_id: str, after: int) -> bool:
    """Serve an ended batch's events from its archived log; False when it has none (its log is in the stream)."""
    # Closed on every path (a client that goes away included): its download of the archived log ends with it.
    async with contextlib.aclosing(archived_frames(deps(request).store, batch_id, after)) as frames:
        try:
            first = await anext(frames, None)
        except ObjectNotFound:
            return False
        await response.prepare(request)
        await response.write(b": connected\n\n")
        with contextlib.suppress(ConnectionResetError):  # the client went away; it can resume with Last-Event-ID
            if first is not None:
                await _sent(request, response, first)
            async for frame in frames:
                await _sent(request, response, frame)
    return True


async def _sent(request: web.Request, response: web.StreamResponse, data: bytes) -> None:
    """Send `data`; a client that takes none of it within `client_idle_timeout_s` (it stopped reading, its buffers
    full) is cut off, its stream ending as if it went away (ConnectionResetError): it resumes with Last-Event-ID."""
    try:
        async with asyncio.timeout(deps(request).settings.client_idle_timeout_s):
            await response.write(data)
    except TimeoutError:
        if request.transport is not None:
            request.transport.abort()  # close() would wait for buffers a stalled client never drains
        raise ConnectionResetError("the client took no event for too long") from None


async def _follow(request: web.Request, response: web.StreamResponse, facts: AsyncIterator[list[Fact]]) -> None:
    idle_s = 0.0
    checked_at = time.monotonic()
    async for group in facts:
        if client_gone(request):
            return
        if time.monotonic() - checked_at >= REVOCATION_CHECK_S:
            checked_at = time.monotonic()
            if not await _key_still_good(request, response):
                return
        if not group:
            idle_s += POLL_S
            if idle_s >= HEARTBEAT_S:
                idle_s = 0.0
                await _sent(request, response, b": heartbeat\n\n")
            continue
        idle_s = 0.0
        for fact in group:
            frame = sse_frame(fact.sequence, fact.data)
            if frame is not None:
                await _sent(request, response, frame)
            if event_name_of(fact.subject) in ENDING_FACT_NAMES:
                return  # the stream ends with the batch's ending fact


async def _key_still_good(request: web.Request, response: web.StreamResponse) -> bool:
    """Whether the stream's key is still not revoked; when it is, the client is told so (the stream then ends)."""
    try:
        authorized = await still_authorized(request)
    except (nats.errors.Error, nats.js.errors.Error) as error:
        # Not checked is not allowed: the client resumes from its last event once the broker answers.
        log.warning("could not check an event stream's key (%r); ending the stream", error)
        return False
    if not authorized:
        await _sent(request, response, REVOKED_FRAME)
    return authorized


async def stream_batch_events(request: web.Request) -> web.StreamResponse:
    batch_id = request.match_info["batch_id"]
    record = await owned_batch(deps(request), principal(request), batch_id)
    with request.app[OPEN_STREAMS].holding(principal(request).owner):
        return await _stream(request, record)


async def _stream(request: web.Request, record: BatchRecord) -> web.StreamResponse:
    batch_id = record.batch.id
    after = resume_after(request)
    js = deps(request).bus.js
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           "X-Accel-Buffering": "no"})
    if request.method == "HEAD":  # the headers GET would send, and no stream
        await response.prepare(request)
        await response.write_eof()
        return response
    ended_at = await terminal_sequence(js, batch_id) if after else None
    if ended_at is not None and ended_at <= after:  # the client has seen the end
        await response.prepare(request)
        await response.write(b": connected\n\n")
        return response
    if (record.batch.status in TERMINAL and await terminal_sequence(js, batch_id) is None
            and await _archived(request, response, batch_id, after)):
        return response
    # Read after the check: a terminal fact stored meanwhile comes after `after`, so the stream still ends. The
    # reader's consumer exists before the client hears "connected", and goes with the stream on every path.
    async with eventlog.following(deps(request).bus, batch_events(batch_id), after, FACTS_PER_READ, idle=True) as facts:
        with contextlib.suppress(ConnectionResetError):  # the client went away; it can resume with Last-Event-ID
            await response.prepare(request)
            await _sent(request, response, b": connected\n\n")
            await _follow(request, response, facts)
    return response
