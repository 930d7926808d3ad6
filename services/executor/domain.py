"""Pure execution logic: result lines, resuming from committed chunks, chunk bookkeeping, files and usage.
How a committed line is written as bytes is chunk_lines.py's."""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import orjson

from contracts.api.batch import BatchUsage, InputTokensDetails
from contracts.api.output_line import CommittedLine, OutputError, OutputLine, OutputResponse
from contracts.api.rejected_line import RejectedLine
from contracts.events.batch import ShardLayout
from contracts.ids import batch_request_id, derived_id
from contracts.objects import CHUNK_BYTES
from contracts.subjects import parse_result_chunk_key
from services.executor.chunk_lines import FAST, PLAIN, ResultLine, StoredLine, body_tokens, output_json

REFUSED_ATTEMPT = 0
"""Lines refused by validation are filed as a chunk of this attempt, before any real one."""


class InvalidInputLine(ValueError):
    """A line the validator should have rejected: the input is not what was validated."""


@dataclass(slots=True)
class InputLine:
    """One request of the input file (never changed; not frozen, which costs microseconds a line)."""

    line: int
    """1-based line of the input file."""
    custom_id: str
    body: dict[str, object]


def parse_input_line(line: int, raw: bytes) -> InputLine | None:
    """The request on one input line; None for a blank line. Parsed as the validator parsed it (orjson)."""
    if not raw.strip():
        return None
    try:
        request = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        raise InvalidInputLine(f"line {line} is not JSON: {error}") from error
    if not isinstance(request, dict) or not isinstance(request.get("custom_id"), str):
        raise InvalidInputLine(f"line {line} has no custom_id")
    body = request.get("body")
    if not isinstance(body, dict):
        raise InvalidInputLine(f"line {line} has no body object")
    return InputLine(line, request["custom_id"], body)


def result_line(batch_id: str, line: InputLine, status_code: int, body: dict[str, object]) -> CommittedLine:
    """The output (2xx) or error line (anything else) an engine reply makes of an input line."""
    response = OutputResponse(status_code=status_code, request_id=derived_id("req_", batch_id, line.custom_id),
                              body=body)
    return _committed(batch_id, line, response, None)


def _committed(batch_id: str, line: InputLine, response: OutputResponse | None,
               error: OutputError | None) -> CommittedLine:
    output = OutputLine(id=batch_request_id(batch_id, line.custom_id), custom_id=line.custom_id,
                        response=response, error=error)
    return CommittedLine(line=line.line, custom_id=line.custom_id, output=output)


def finished_line(batch_id: str, line: InputLine, status_code: int, body: dict[str, object]) -> "ResultLine":
    """`result_line` as the runner keeps it: written once by orjson where that writes the models' bytes."""
    if FAST and type(status_code) is int and type(line.custom_id) is str and type(body) is dict:
        output = {"id": batch_request_id(batch_id, line.custom_id), "custom_id": line.custom_id,
                  "response": {"status_code": status_code, "request_id": derived_id("req_", batch_id, line.custom_id),
                               "body": body},
                  "error": None}
        try:
            written = orjson.dumps(output, option=PLAIN)
        except TypeError:  # orjson.JSONEncodeError
            pass
        else:
            succeeded = 200 <= status_code < 300
            tokens = body_tokens(body) if succeeded else (0, 0, 0)
            return StoredLine(line.line, line.custom_id, succeeded, written, tokens)
    return result_line(batch_id, line, status_code, body)


def refused_line(batch_id: str, refused: RejectedLine) -> CommittedLine:
    """The error line of an input line validation refused (allow_partial): it never runs."""
    return CommittedLine(line=refused.line, custom_id=refused.custom_id, output=refused.error_line(batch_id))


def unrun_line(batch_id: str, line: InputLine, code: str, message: str) -> CommittedLine:
    """The error line of an input line that never ran (the batch was cancelled or expired first)."""
    return _committed(batch_id, line, None, OutputError(code=code, message=message))


@dataclass
class Tally:
    completed: int = 0
    failed: int = 0

    def add(self, line: ResultLine) -> None:
        if line.succeeded:
            self.completed += 1
        else:
            self.failed += 1


@dataclass(frozen=True)
class Chunk:
    """Lines to commit together; `completed`/`failed` are the batch's cumulative counts once it is durable."""

    number: int
    lines: tuple[ResultLine, ...]
    completed: int
    failed: int


@dataclass
class ChunkCommitter:
    """Groups finished lines into chunks of `chunk_lines`, numbered on from `next_chunk`; sooner once the first waited
    `max_wait_s` (slow lines still show progress), or past `max_bytes` (no chunk grows past what is read back)."""

    chunk_lines: int
    next_chunk: int
    tally: Tally
    max_wait_s: float = float("inf")
    max_bytes: int = CHUNK_BYTES
    pending: list[ResultLine] = field(default_factory=list)
    pending_since: float = 0.0
    pending_bytes: int = 0
    unwritten: Exception | None = None
    """Why a chunk it made was not written: its counts are in the tally, so no later chunk may be made (each would
    state lines no chunk holds); the attempt ends and is run again from what was written."""

    def add(self, line: ResultLine, now: float = 0.0) -> Chunk | None:
        if not self.pending:
            self.pending_since = now
        self.pending.append(line)
        self.pending_bytes += len(output_json(line))
        return self.flush() if self.due(now) else None

    def due(self, now: float) -> bool:
        """Whether the pending lines are to be committed now: a whole chunk, or its first line waited long enough."""
        return bool(self.pending) and (len(self.pending) >= self.chunk_lines or self.pending_bytes >= self.max_bytes
                                       or now - self.pending_since >= self.max_wait_s)

    def flush(self) -> Chunk | None:
        if self.unwritten is not None:
            raise self.unwritten  # what the write met: a write fault is waited out, and the attempt run again
        if not self.pending:
            return None
        for line in self.pending:
            self.tally.add(line)
        chunk = Chunk(self.next_chunk, tuple(self.pending), self.tally.completed, self.tally.failed)
        self.next_chunk += 1
        self.pending = []
        self.pending_bytes = 0
        return chunk


def chunk_position(key: str) -> tuple[int, int]:
    """(attempt, chunk) of a result chunk key."""
    parsed = parse_result_chunk_key(key)
    if parsed is None:
        raise ValueError(f"not a result chunk key: {key}")
    return parsed[1], parsed[2]


@dataclass
class Resume:
    """What earlier deliveries and attempts committed, and where this attempt's chunk numbering goes on."""

    committed: dict[int, ResultLine]
    """By input line."""
    next_chunk: int
    last_chunk: int | None
    """This attempt's latest committed chunk, whose progress event may not have been published yet."""
    last_chunk_usage: BatchUsage | None = None
    """The tokens of that chunk's lines: its progress event carries them."""

    @classmethod
    def from_chunks(cls, chunks: Iterable[tuple[str, Sequence[ResultLine]]], attempt: int) -> "Resume":
        committed: dict[int, ResultLine] = {}
        last_chunk: int | None = None
        last_usage: BatchUsage | None = None
        for key, lines in sorted(chunks, key=lambda item: chunk_position(item[0])):
            chunk_attempt, number = chunk_position(key)
            if chunk_attempt == attempt:
                last_chunk, last_usage = number, usage_of(lines)
            for line in lines:
                # The earliest commit of a line wins, so every attempt assembles the same files.
                committed.setdefault(line.line, line)
        next_chunk = 0 if last_chunk is None else last_chunk + 1
        return cls(committed, next_chunk, last_chunk, last_usage)

    def tally(self, layout: ShardLayout | None = None, shard: int = 0) -> Tally:
        """Counts of the committed lines, of one shard's lines when a `layout` is given."""
        tally = Tally()
        for line in self.committed.values():
            if layout is None or layout.shard_of(line.line) == shard:
                tally.add(line)
        return tally


@dataclass(frozen=True)
class ResultFiles:
    output: bytes
    errors: bytes
    output_lines: int
    error_lines: int


def assemble(lines: Iterable[ResultLine]) -> ResultFiles:
    """The output file (successes) and error file (the rest), each in input order."""
    ordered = sorted(lines, key=lambda line: line.line)
    successes = [output_json(line) for line in ordered if line.succeeded]
    failures = [output_json(line) for line in ordered if not line.succeeded]
    return ResultFiles(
        output=b"".join(out + b"\n" for out in successes),
        errors=b"".join(out + b"\n" for out in failures),
        output_lines=len(successes),
        error_lines=len(failures),
    )


def usage_of(lines: Iterable[ResultLine]) -> BatchUsage:
    """Token usage summed over the successful lines' bodies."""
    prompt = completion = cached = 0
    for line in lines:
        if not line.succeeded:
            continue
        if isinstance(line, StoredLine):
            tokens = line.tokens
        elif line.output.response is not None:
            tokens = body_tokens(line.output.response.body)
        else:
            continue
        prompt, completion, cached = prompt + tokens[0], completion + tokens[1], cached + tokens[2]
    return BatchUsage(input_tokens=prompt, output_tokens=completion, total_tokens=prompt + completion,
                      input_tokens_details=InputTokensDetails(cached_tokens=cached))
