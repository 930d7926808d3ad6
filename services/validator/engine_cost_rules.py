"""Bounds on what one line may ask an engine to compute beyond its tokens, where an unbounded value would stall or
kill the engine every tenant's lines share. llama.cpp turns a JSON schema (structured output, tool parameters) into
a grammar checked on the one thread that drives every slot: a repeated group in a `pattern` (`(a?){1999}`) cost it
minutes per token, thousands of `enum` values minutes before the first, thousands of properties minutes on a
slot's thread. Asked for the top log-probabilities past OpenAI's limits, it returns the whole vocabulary for every
token (110 MB of memory per token). The limits are OpenAI's where it states them, else far above any real schema's
needs (each refusal says which)."""

import re
from collections.abc import Iterator

import orjson

from services.validator.issues import LineIssue

SCHEMA_KEYS = ("response_format", "text", "tools", "json_schema")
"""Where a line's JSON schemas are: structured output (chat, completions, responses) and tool parameters."""
MAX_SCHEMA_BYTES = 16_384
MAX_ENUM_VALUES = 256
MAX_PROPERTIES = 128
MAX_PATTERN_CHARS = 256
MAX_PATTERN_QUANTIFIERS = 16
REPEATED_GROUP = re.compile(r"\)(?:[*+]|\{\d)")
"""A group repeated (`(…)*`, `(…)+`, `(…){n}`): its matches can be split in many ways, each a path of the grammar."""
QUANTIFIER = re.compile(r"(?<!\\)(?:[*+?]|\{\d)")
TOP_PROBABILITIES = {"top_logprobs": 20, "n_probs": 20}
"""OpenAI's limit on `top_logprobs` (and llama.cpp's `n_probs`, the same thing)."""
COMPLETION_LOGPROBS = 5
"""OpenAI's limit on the legacy completions' `logprobs` (an integer there, a boolean in chat)."""
COSTED = frozenset({*SCHEMA_KEYS, *TOP_PROBABILITIES, "logprobs"})
"""What `engine_cost_issues` reads: a body naming none of these has none."""


def engine_cost_issues(body: dict[str, object], endpoint: str) -> Iterator[LineIssue]:
    for key in SCHEMA_KEYS:
        value = body.get(key)
        if isinstance(value, dict | list):
            yield from _schema_issues(key, value)
    for name, limit in TOP_PROBABILITIES.items():
        value = body.get(name)
        if value is not None and not _within(value, limit):
            yield LineIssue("invalid_body", f"{name} must be an integer from 0 to {limit}.", f"body.{name}")
    logprobs = body.get("logprobs")
    if endpoint == "/v1/completions" and logprobs is not None and not isinstance(logprobs, bool) \
            and not _within(logprobs, COMPLETION_LOGPROBS):
        yield LineIssue("invalid_body", f"logprobs must be an integer from 0 to {COMPLETION_LOGPROBS}.",
                        "body.logprobs")


def _within(value: object, limit: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= limit


def _schema_issues(key: str, value: dict[str, object] | list[object]) -> Iterator[LineIssue]:
    param = f"body.{key}"
    size = len(orjson.dumps(value))
    if size > MAX_SCHEMA_BYTES:
        yield LineIssue("invalid_body", f"body.{key} is {size} bytes of JSON; a line's schemas may take at most "
                        f"{MAX_SCHEMA_BYTES} (the engine compiles them into a grammar every slot waits on).", param)
        return
    enum_values = properties = 0
    stack: list[object] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
            continue
        if not isinstance(item, dict):
            continue
        enum = item.get("enum")
        if isinstance(enum, list):
            enum_values += len(enum)
        named = item.get("properties")
        if isinstance(named, dict):
            properties += len(named)
        for pattern in _patterns(item):
            yield from _pattern_issues(pattern, param)
        stack.extend(item.values())
    if enum_values > MAX_ENUM_VALUES:
        yield LineIssue("invalid_body", f"body.{key} lists {enum_values} enum values; a line's schemas may list at "
                        f"most {MAX_ENUM_VALUES}.", param)
    if properties > MAX_PROPERTIES:
        yield LineIssue("invalid_body", f"body.{key} names {properties} properties; a line's schemas may name at "
                        f"most {MAX_PROPERTIES}.", param)


def _patterns(schema: dict[object, object]) -> Iterator[str]:
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        yield pattern
    by_pattern = schema.get("patternProperties")
    if isinstance(by_pattern, dict):
        yield from (name for name in by_pattern if isinstance(name, str))


def _pattern_issues(pattern: str, param: str) -> Iterator[LineIssue]:
    if len(pattern) > MAX_PATTERN_CHARS:
        yield LineIssue("invalid_body", f"A schema pattern of {len(pattern)} characters: at most "
                        f"{MAX_PATTERN_CHARS}.", param)
    elif REPEATED_GROUP.search(pattern):
        yield LineIssue("invalid_body", f"The schema pattern {pattern[:80]!r} repeats a group ((…)*, (…)+ or "
                        "(…){n}), which the engine cannot follow in bounded time; repeat single characters or "
                        "classes instead.", param)
    elif len(QUANTIFIER.findall(pattern)) > MAX_PATTERN_QUANTIFIERS:
        yield LineIssue("invalid_body", f"The schema pattern {pattern[:80]!r} has more than "
                        f"{MAX_PATTERN_QUANTIFIERS} quantifiers.", param)
