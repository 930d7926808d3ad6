"""A batch fact from the stream as the public SSE frame: `BatchStreamEvent`, never the internal payload."""

import logging
from typing import cast

from pydantic import ValidationError

from contracts.api.batch_event import EVENT_FIELDS, BatchEventType, BatchStreamEvent
from contracts.events.batch import BatchEvent
from contracts.events.registry import decode_event

log = logging.getLogger(__name__)


def public_event(event: BatchEvent) -> BatchStreamEvent | None:
    """The fact in its public shape; None for a fact with none (it is not shown)."""
    fields = EVENT_FIELDS.get(cast(BatchEventType, event.type))
    if fields is None:
        return None
    values = {**dict(getattr(event, "terms", {})), **dict(event)}  # its terms are public as fields of its own
    return BatchStreamEvent.model_validate({"type": event.type, "batch_id": event.aggregate_id,
                                            "occurred_at": event.occurred_at,
                                            **{name: values[name] for name in fields}})


def sse_frame(sequence: int, data: bytes) -> bytes | None:
    """The frame for the stored fact at `sequence`; None when it cannot be shown (logged)."""
    try:
        event = decode_event(data)
    except ValidationError:
        log.warning("event at sequence %d does not decode; left out of the stream", sequence)
        return None
    shown = public_event(event) if isinstance(event, BatchEvent) else None
    if shown is None:
        return None
    payload = shown.model_dump_json(exclude_unset=True)
    return f"id: {sequence}\nevent: {shown.type}\ndata: {payload}\n\n".encode()
