"""`GET /v1/batches/{id}/events`: the batch's own facts as Server-Sent Events, resumable by sequence."""

import nats.errors
from aiohttp import web
from nats.js.api import ConsumerConfig, DeliverPolicy

from contracts.subjects import batch_events
from services.gateway.context import deps
from services.gateway.errors import bad_request
from services.gateway.views.batches import owned_batch

TERMINAL_EVENT_TYPES = frozenset({"batch.completed", "batch.failed", "batch.validation_failed", "batch.cancelled",
                                  "batch.expired"})
HEARTBEAT_S = 15.0


def resume_after(request: web.Request) -> int:
    raw = request.headers.get("Last-Event-ID") or request.query.get("last_event_id") or "0"
    try:
        return max(int(raw), 0)
    except ValueError:
        raise bad_request("Last-Event-ID must be the integer id of an event already received.",
                          "invalid_last_event_id") from None


async def stream_batch_events(request: web.Request) -> web.StreamResponse:
    batch_id = request.match_info["batch_id"]
    await owned_batch(request, batch_id)
    after = resume_after(request)
    js = deps(request).bus.js
    config = ConsumerConfig(opt_start_seq=after + 1) if after else None
    policy = DeliverPolicy.BY_START_SEQUENCE if after else DeliverPolicy.ALL
    subscription = await js.subscribe(batch_events(batch_id), ordered_consumer=True, deliver_policy=policy,
                                      config=config)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           "X-Accel-Buffering": "no"})
    await response.prepare(request)
    try:
        await response.write(b": connected\n\n")
        while True:
            try:
                message = await subscription.next_msg(timeout=HEARTBEAT_S)
            except nats.errors.TimeoutError:
                await response.write(b": heartbeat\n\n")
                continue
            event_type = message.subject.rsplit(".", 1)[-1]
            frame = (f"id: {message.metadata.sequence.stream}\nevent: batch.{event_type}\n"
                     f"data: {message.data.decode()}\n\n")
            await response.write(frame.encode())
            if f"batch.{event_type}" in TERMINAL_EVENT_TYPES:
                break
    except ConnectionResetError:
        pass  # the client went away; it can resume with Last-Event-ID
    finally:
        await subscription.unsubscribe()
    return response
