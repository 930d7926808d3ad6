"""Pure execution logic: result lines, resuming from committed chunks, chunk bookkeeping, files and usage,
and the invariant every terminal batch keeps.

Result lines are written and read by orjson where it writes exactly the bytes the pydantic models write (their
fields, in their order, of JSON's own types): a chunk line read back is kept as its bytes (`StoredLine`) and goes into
the output file as it is; any other line takes the models' way, as every line did before.
"""

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from contracts.api.batch import BatchUsage, InputTokensDetails
from contracts.api.output_line import CommittedLine, OutputError, OutputLine, OutputResponse
from contracts.api.rejected_line import RejectedLine
from contracts.events.batch import ShardLayout
from contracts.ids import batch_request_id, derived_id
from contracts.subjects import parse_result_chunk_key

REFUSED_ATTEMPT = 0
"""Lines refused by validation are filed as a chunk of this attempt, before any real one."""


class InvalidInputLine(ValueError):
    """A line the validator should have rejected: the input is not what was validated."""


@dataclass(slots=True)
class InputLine:
    """One request of the input file (made once per line and never changed: not frozen, which costs microseconds a
    line to build)."""

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
    response = OutputResponse(
        status_code=status_code,
        request_id=derived_id("req_", batch_id, line.custom_id),
        body=body,
    )
    output = OutputLine(id=batch_request_id(batch_id, line.custom_id), custom_id=line.custom_id,
                        response=response, error=None)
    return CommittedLine(line=line.line, custom_id=line.custom_id, output=output)


def finished_line(batch_id: str, line: InputLine, status_code: int, body: dict[str, object]) -> "ResultLine":
    """`result_line` as the runner keeps it: its output line written once, by orjson, where that writes the models'
    bytes (of JSON's own types); else (a body the models refuse included) the model itself."""
    if _FAST and type(status_code) is int and type(line.custom_id) is str and type(body) is dict:
        output = {"id": batch_request_id(batch_id, line.custom_id), "custom_id": line.custom_id,
                  "response": {"status_code": status_code, "request_id": derived_id("req_", batch_id, line.custom_id),
                               "body": body},
                  "error": None}
        try:
            written = orjson.dumps(output, option=_PLAIN)
        except TypeError:  # orjson.JSONEncodeError
            pass
        else:
            succeeded = 200 <= status_code < 300
            return StoredLine(line.line, line.custom_id, succeeded, written, _tokens(body) if succeeded else (0, 0, 0))
    return result_line(batch_id, line, status_code, body)


def refused_line(batch_id: str, refused: RejectedLine) -> CommittedLine:
    """The error line of an input line validation refused (allow_partial): it never runs. A repeated custom_id
    is named by its line, so its id differs from the line that used the custom_id first."""
    return CommittedLine(line=refused.line, custom_id=refused.custom_id, output=refused.error_line(batch_id))


def unrun_line(batch_id: str, line: InputLine, code: str, message: str) -> CommittedLine:
    """The error line of an input line that never ran (the batch was cancelled or expired first)."""
    output = OutputLine(id=batch_request_id(batch_id, line.custom_id), custom_id=line.custom_id,
                        response=None, error=OutputError(code=code, message=message))
    return CommittedLine(line=line.line, custom_id=line.custom_id, output=output)


_PLAIN = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_SUBCLASS
"""orjson on JSON's own types only: anything else (a datetime, a numpy number, a subclass) raises, and the model
writes it instead."""
_LINE_KEYS = ["line", "custom_id", "output"]
_OUTPUT_KEYS = ["id", "custom_id", "response", "error"]
_RESPONSE_KEYS = ["status_code", "request_id", "body"]
_ERROR_KEYS = ["code", "message"]
_FAST = (list(CommittedLine.model_fields) == _LINE_KEYS and list(OutputLine.model_fields) == [*_OUTPUT_KEYS, "line"]
         and list(OutputResponse.model_fields) == _RESPONSE_KEYS and list(OutputError.model_fields) == _ERROR_KEYS)
"""The models are still the shape written here by hand (if one gains a field, every line takes the models' way)."""


@dataclass(slots=True)
class StoredLine:
    """A committed line kept as the bytes the models write of it (made here, or read back from a chunk): what
    resuming and the files need, and its output line's bytes, which go into the output or error file unchanged.
    Never changed once made (not frozen, which costs microseconds a line to build)."""

    line: int
    custom_id: str | None
    succeeded: bool
    output_json: bytes
    """`OutputLine.model_dump_json()` of its output line, byte for byte."""
    tokens: tuple[int, int, int]
    """(prompt, completion, cached prompt) tokens of a successful line's body; zeros for any other."""

    @property
    def key(self) -> int:
        return self.line


ResultLine = CommittedLine | StoredLine
"""A committed line as this executor holds it: made here (or refused, or never run), or read back from a chunk."""


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
    """Groups finished lines into chunks of `chunk_lines`, numbered on from `next_chunk`; a chunk whose first line
    finished `max_wait_s` ago or more is committed however few it holds (with the next line, or by the runner's
    clock, `due`), so an attempt whose lines finish slowly still commits, and shows progress, every few seconds."""

    chunk_lines: int
    next_chunk: int
    tally: Tally
    max_wait_s: float = float("inf")
    pending: list[ResultLine] = field(default_factory=list)
    pending_since: float = 0.0

    def add(self, line: ResultLine, now: float = 0.0) -> Chunk | None:
        if not self.pending:
            self.pending_since = now
        self.pending.append(line)
        return self.flush() if self.due(now) else None

    def due(self, now: float) -> bool:
        """Whether the pending lines are to be committed now: a whole chunk, or its first line waited long enough."""
        return bool(self.pending) and (len(self.pending) >= self.chunk_lines
                                       or now - self.pending_since >= self.max_wait_s)

    def flush(self) -> Chunk | None:
        if not self.pending:
            return None
        for line in self.pending:
            self.tally.add(line)
        chunk = Chunk(self.next_chunk, tuple(self.pending), self.tally.completed, self.tally.failed)
        self.next_chunk += 1
        self.pending = []
        return chunk


def chunk_position(key: str) -> tuple[int, int]:
    """(attempt, chunk) of a result chunk key."""
    parsed = parse_result_chunk_key(key)
    if parsed is None:
        raise ValueError(f"not a result chunk key: {key}")
    return parsed[1], parsed[2]


def _output_dict(output: OutputLine) -> dict[str, Any]:
    response, error = output.response, output.error
    dumped: dict[str, Any] = {
        "id": output.id, "custom_id": output.custom_id,
        "response": None if response is None else {"status_code": response.status_code,
                                                   "request_id": response.request_id, "body": response.body},
        "error": None if error is None else {"code": error.code, "message": error.message}}
    if output.line is not None:
        dumped["line"] = output.line
    return dumped


def output_json(line: ResultLine) -> bytes:
    """The line's output line as `OutputLine.model_dump_json()` writes it."""
    if isinstance(line, StoredLine):
        return line.output_json
    if _FAST:
        try:
            return orjson.dumps(_output_dict(line.output), option=_PLAIN)
        except TypeError:  # orjson.JSONEncodeError: not of JSON's own types (or an integer past 64 bits)
            pass
    return line.output.model_dump_json().encode()


def line_json(line: ResultLine) -> bytes:
    """The chunk line of a committed line, as `CommittedLine.model_dump_json()` writes it."""
    if isinstance(line, StoredLine):
        return b'{"line":%d,"custom_id":%b,"output":%b}' % (line.line, orjson.dumps(line.custom_id), line.output_json)
    if _FAST:
        try:
            return orjson.dumps({"line": line.line, "custom_id": line.custom_id, "output": _output_dict(line.output)},
                                option=_PLAIN)
        except TypeError:
            pass
    return line.model_dump_json().encode()


def encode_chunk(lines: Iterable[ResultLine]) -> bytes:
    return b"".join(line_json(line) + b"\n" for line in lines)


def decode_chunk(data: bytes) -> list[CommittedLine]:
    return [CommittedLine.model_validate_json(raw) for raw in data.splitlines() if raw.strip()]


def read_chunk(data: bytes) -> list[ResultLine]:
    """A chunk's lines: each one written as the models write it kept as its bytes, any other decoded by the models
    (which refuse what is not a committed line, as `decode_chunk` does)."""
    return [_stored(raw) or CommittedLine.model_validate_json(raw) for raw in data.splitlines() if raw.strip()]


def _stored(raw: bytes) -> StoredLine | None:
    """The line kept as its bytes, if the models would write back exactly these bytes; else None."""
    if not _FAST:
        return None
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if type(parsed) is not dict or list(parsed) != _LINE_KEYS or type(parsed["line"]) is not int \
            or not _str_or_none(parsed["custom_id"]) or not _canonical_output(parsed["output"]):
        return None
    try:
        if orjson.dumps(parsed) != raw:  # spacing, escapes, number forms the models would write otherwise
            return None
    except orjson.JSONEncodeError:
        return None
    response = parsed["output"]["response"]
    succeeded = response is not None and 200 <= response["status_code"] < 300
    return StoredLine(parsed["line"], parsed["custom_id"], succeeded, raw[raw.index(b',"output":') + 10:-1],
                      _tokens(response["body"]) if succeeded else (0, 0, 0))


def _str_or_none(value: object) -> bool:
    return value is None or type(value) is str


def _canonical_output(output: object) -> bool:
    """An output line of exactly the models' fields, in their order, each of the type they hold."""
    if type(output) is not dict:
        return False
    keys = list(output)
    if keys != _OUTPUT_KEYS and (keys != [*_OUTPUT_KEYS, "line"] or type(output["line"]) is not int):
        return False
    response, error = output["response"], output["error"]
    return (type(output["id"]) is str and _str_or_none(output["custom_id"])
            and (response is None or (type(response) is dict and list(response) == _RESPONSE_KEYS
                                      and type(response["status_code"]) is int
                                      and type(response["request_id"]) is str and type(response["body"]) is dict))
            and (error is None or (type(error) is dict and list(error) == _ERROR_KEYS
                                   and type(error["code"]) is str and type(error["message"]) is str)))


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
                committed.setdefault(line.key, line)
        next_chunk = 0 if last_chunk is None else last_chunk + 1
        return cls(committed, next_chunk, last_chunk, last_usage)

    @property
    def committed_lines(self) -> set[int]:
        return set(self.committed)

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


def _count(mapping: object, *keys: str) -> int:
    """The first integer found under `keys` (chat says prompt_tokens, Responses says input_tokens)."""
    if not isinstance(mapping, dict):
        return 0
    for key in keys:
        value = mapping.get(key)
        if isinstance(value, int):
            return value
    return 0


def _tokens(body: dict[str, object]) -> tuple[int, int, int]:
    """(prompt, completion, cached prompt) tokens a response body states."""
    usage = body.get("usage")
    if not isinstance(usage, dict):
        return 0, 0, 0
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details")
    return (_count(usage, "prompt_tokens", "input_tokens"), _count(usage, "completion_tokens", "output_tokens"),
            _count(details, "cached_tokens"))


def usage_of(lines: Iterable[ResultLine]) -> BatchUsage:
    """Token usage summed over the successful lines' bodies: chat and completions, embeddings (prompt tokens
    only) and responses (input/output tokens)."""
    prompt = completion = cached = 0
    for line in lines:
        if not line.succeeded:
            continue
        if isinstance(line, StoredLine):
            tokens = line.tokens
        elif line.output.response is not None:
            tokens = _tokens(line.output.response.body)
        else:
            continue
        prompt, completion, cached = prompt + tokens[0], completion + tokens[1], cached + tokens[2]
    return BatchUsage(input_tokens=prompt, output_tokens=completion, total_tokens=prompt + completion,
                      input_tokens_details=InputTokensDetails(cached_tokens=cached))


class InvariantBroken(AssertionError):
    """A terminal batch whose files do not account for every input line exactly once."""


def check_invariant(total: int, completed: int, failed: int, output: bytes, errors: bytes) -> None:
    """completed + failed = total = output lines + error lines, each line's id once across both files (custom_ids
    may repeat: allow_partial runs the first line of a repeated custom_id and refuses the others)."""
    ids = [orjson.loads(raw)["id"] for raw in [*output.splitlines(), *errors.splitlines()] if raw.strip()]
    output_lines = sum(1 for raw in output.splitlines() if raw.strip())
    problems = []
    if completed + failed != total:
        problems.append(f"completed {completed} + failed {failed} != total {total}")
    if len(ids) != total:
        problems.append(f"{len(ids)} file lines for {total} input lines")
    if output_lines != completed:
        problems.append(f"{output_lines} output lines but {completed} completed")
    duplicates = sorted(ident for ident, seen in Counter(ids).items() if seen > 1)
    if duplicates:
        problems.append(f"ids more than once: {duplicates[:5]}")
    if problems:
        raise InvariantBroken("; ".join(problems))
