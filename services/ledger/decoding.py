"""Stream facts decoded for the fold, each once: a progress fact (most of a busy stream) as a small `ProgressFact`,
read straight from its JSON when plainly well formed (as its contract would accept it, nothing coerced); any other
fact, or a doubtful one, by its contract."""

import logging
import re
from typing import NamedTuple

from pydantic import ValidationError

from contracts.events.batch import BatchProgressed
from contracts.events.envelope import Event
from contracts.events.registry import decode_event
from services.ledger.chain import Fact

log = logging.getLogger(__name__)

_PROGRESS_MARK = b'"type":"batch.progressed"'
"""In every progress fact as our publishers write it; a payload without it is left to pydantic at once."""
_TEXT = rb'"[\x20\x21\x23-\x5b\x5d-\x7e]*"'
"""A JSON string of printable ASCII without escapes (any other string is pydantic's to judge)."""
_INT = rb"-?(?:0|[1-9][0-9]{0,17})"
"""A JSON integer that fits 64 bits (no fraction, no exponent)."""
_FIELDS = ("event_id", "type", "version", "occurred_at", "aggregate_id", "correlation_id", "causation_id", "attempt",
           "chunk", "chunk_key", "completed", "failed", "shard", "usage")
"""`BatchProgressed`'s fields in the order `model_dump_json` writes them."""
_PLAIN_PROGRESS: re.Pattern[bytes] | None = re.compile(
    rb'\{"event_id":%(text)s,"type":"batch\.progressed","version":%(int)s,"occurred_at":(%(int)s),'
    rb'"aggregate_id":"([\x20\x21\x23-\x5b\x5d-\x7e]*)","correlation_id":(?:null|%(text)s),'
    rb'"causation_id":(?:null|%(text)s),"attempt":(%(int)s),"chunk":%(int)s,"chunk_key":(%(text)s),'
    rb'"completed":(%(int)s),"failed":(%(int)s),"shard":(%(int)s),"usage":(?:null|\{"input_tokens":(%(int)s),'
    rb'"input_tokens_details":\{"cached_tokens":(%(int)s)\},"output_tokens":(%(int)s),'
    rb'"output_tokens_details":\{"reasoning_tokens":%(int)s\},"total_tokens":%(int)s\})\}'
    % {b"text": _TEXT, b"int": _INT}
) if tuple(BatchProgressed.model_fields) == _FIELDS else None
"""A progress fact exactly as `model_dump_json` writes one, every field of its contract's JSON type: pydantic would
accept it with the same values (nothing here is coerced). None when the contract's fields change (no shortcut)."""


class ChunkUsage(NamedTuple):
    """A result chunk's tokens, as a billed batch is debited for them."""

    input_tokens: int
    cached_tokens: int
    output_tokens: int


class ProgressFact(NamedTuple):
    """What the fold reads of a `BatchProgressed`."""

    aggregate_id: str
    attempt: int
    completed: int
    failed: int
    shard: int
    chunk_key: str = ""
    usage: ChunkUsage | None = None
    occurred_at: int = 0
    """Milliseconds since the epoch."""

    @property
    def type(self) -> str:
        return "batch.progressed"

    @classmethod
    def of(cls, event: BatchProgressed) -> "ProgressFact":
        usage = event.usage
        tokens = None if usage is None else ChunkUsage(usage.input_tokens, usage.input_tokens_details.cached_tokens,
                                                       usage.output_tokens)
        return cls(event.aggregate_id, event.attempt, event.completed, event.failed, event.shard, event.chunk_key,
                   tokens, event.occurred_at)


def decode_fact(fact: Fact) -> Event | ProgressFact | None:
    """The fact as the fold takes it; None (logged) for a payload that is no event the ledger knows."""
    if _PROGRESS_MARK in fact.data:
        progress = _plain_progress(fact.data)
        if progress is not None:
            return progress
    try:
        event = decode_event(fact.data)
    except ValidationError as error:
        log.warning("sequence %d: not an event the ledger knows, skipped: %s", fact.sequence, error.errors()[0]["msg"])
        return None
    return ProgressFact.of(event) if isinstance(event, BatchProgressed) else event


def _plain_progress(data: bytes) -> ProgressFact | None:
    """The fact, when it is a progress fact in exactly the shape above; None: let pydantic judge it."""
    match = None if _PLAIN_PROGRESS is None else _PLAIN_PROGRESS.fullmatch(data)
    if match is None:
        return None
    at, aggregate_id, attempt, chunk_key, completed, failed, shard, input_tokens, cached, output = match.groups()
    usage = None if input_tokens is None else ChunkUsage(int(input_tokens), int(cached), int(output))
    return ProgressFact(aggregate_id.decode(), int(attempt), int(completed), int(failed), int(shard),
                        chunk_key.decode()[1:-1], usage, int(at))
