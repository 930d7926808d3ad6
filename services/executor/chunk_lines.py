"""Committed lines as chunk and file bytes, written and read by orjson where it writes exactly the models' bytes (a
chunk line read back is kept as its bytes, `StoredLine`, and goes into the files as it is); else the models' way."""

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from contracts.api.output_line import CommittedLine, OutputError, OutputLine, OutputResponse

PLAIN = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_SUBCLASS
"""orjson on JSON's own types only: anything else (a datetime, a subclass) raises, and the model writes it instead."""
_LINE_KEYS = ["line", "custom_id", "output"]
_OUTPUT_KEYS = ["id", "custom_id", "response", "error"]
_RESPONSE_KEYS = ["status_code", "request_id", "body"]
_ERROR_KEYS = ["code", "message"]
FAST = (list(CommittedLine.model_fields) == _LINE_KEYS and list(OutputLine.model_fields) == [*_OUTPUT_KEYS, "line"]
         and list(OutputResponse.model_fields) == _RESPONSE_KEYS and list(OutputError.model_fields) == _ERROR_KEYS)
"""The models are still the shape written here by hand (if one gains a field, every line takes the models' way)."""


@dataclass(slots=True)
class StoredLine:
    """A committed line kept as the bytes the models write of it (never changed; not frozen: that costs time)."""

    line: int
    custom_id: str | None
    succeeded: bool
    output_json: bytes
    """`OutputLine.model_dump_json()` of its output line, byte for byte."""
    tokens: tuple[int, int, int]
    """(prompt, completion, cached prompt) tokens of a successful line's body; zeros for any other."""


ResultLine = CommittedLine | StoredLine
"""A committed line as this executor holds it: made here (or refused, or never run), or read back from a chunk."""


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
    if FAST:  # orjson.JSONEncodeError (a TypeError): not of JSON's own types (or an integer past 64 bits)
        with contextlib.suppress(TypeError):
            return orjson.dumps(_output_dict(line.output), option=PLAIN)
    return line.output.model_dump_json().encode()


def line_json(line: ResultLine) -> bytes:
    """The chunk line of a committed line, as `CommittedLine.model_dump_json()` writes it."""
    if not FAST and isinstance(line, CommittedLine):
        return line.model_dump_json().encode()
    return b'{"line":%d,"custom_id":%b,"output":%b}' % (line.line, orjson.dumps(line.custom_id), output_json(line))


def encode_chunk(lines: Iterable[ResultLine]) -> bytes:
    return b"".join(line_json(line) + b"\n" for line in lines)


def read_chunk(data: bytes) -> list[ResultLine]:
    """A chunk's lines: those written as the models write them kept as bytes, any other decoded by the models."""
    return [_stored(raw) or CommittedLine.model_validate_json(raw) for raw in data.splitlines() if raw.strip()]


def _stored(raw: bytes) -> StoredLine | None:
    """The line kept as its bytes, if the models would write back exactly these bytes; else None."""
    if not FAST:
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
                      body_tokens(response["body"]) if succeeded else (0, 0, 0))


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


def _count(mapping: object, *keys: str) -> int:
    """The first integer found under `keys` (chat says prompt_tokens, Responses says input_tokens)."""
    if not isinstance(mapping, dict):
        return 0
    for key in keys:
        value = mapping.get(key)
        if isinstance(value, int):
            return value
    return 0


def body_tokens(body: dict[str, object]) -> tuple[int, int, int]:
    """(prompt, completion, cached prompt) tokens a response body states."""
    usage = body.get("usage")
    if not isinstance(usage, dict):
        return 0, 0, 0
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details")
    return (_count(usage, "prompt_tokens", "input_tokens"), _count(usage, "completion_tokens", "output_tokens"),
            _count(details, "cached_tokens"))
