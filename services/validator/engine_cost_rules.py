"""Bounds on what one line may ask an engine to compute beyond its tokens, where an unbounded value would stall or
kill the engine every tenant's lines share. llama.cpp turns a JSON schema (structured output, tool parameters) into
a grammar checked on the one thread that drives every slot: a repeated group in a `pattern` (`(a?){1999}`) cost it
minutes per token, 6,000 `enum` values 67 s before the first token, 3,000 properties of one object 102 s on a slot's
thread. Asked for the top log-probabilities past OpenAI's limits, it returns the whole vocabulary for every token
(110 MB of memory per token). The log-probability limits are OpenAI's; the schema limits are this service's, below
OpenAI's (each refusal says both), and count only what is compiled: the schemas, walked by their keywords."""

import re
from collections.abc import Generator, Iterator

import orjson

from services.validator.issues import LineIssue

SCHEMA_KEYS = ("response_format", "text", "tools")
"""Where a line's JSON schemas are: structured output (chat and completions, responses) and tool parameters."""
MAX_SCHEMA_BYTES = 32_768
MAX_ENUM_VALUES = 500
"""In all of a line's schemas (OpenAI allows 1,000)."""
MAX_OBJECT_PROPERTIES = 128
"""Per object of a schema: an object's optional properties cost the grammar about their cube."""
MAX_PROPERTIES = 1_000
"""In all of a line's schemas (OpenAI allows 5,000)."""
MAX_PATTERN_CHARS = 256
MAX_PATTERN_QUANTIFIERS = 16
MAX_PATTERN_REPEATS = 32_000
"""In all of a line's patterns: the bounds their counted quantifiers (`{n}`, `{m,}`, `{m,n}`) repeat to, summed.
llama.cpp writes each as that many copies of what it repeats (up to 2,000 each), so its cost is their sum, however few
the quantifiers: 124 patterns of 16 `[a-z]{0,1999}` (about 4M copies, in bounds each) stalled all slots 6.7 s a line."""
SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
SUBSCHEMAS = ("items", "additionalProperties", "propertyNames", "not", "if", "then", "else", "contains",
              "unevaluatedItems", "unevaluatedProperties", "additionalItems")
WHY = "the engine compiles a schema into a grammar that every slot of it waits on"
TOP_PROBABILITIES = {"top_logprobs": 20, "n_probs": 20}
"""OpenAI's limit on `top_logprobs` (and llama.cpp's `n_probs`, the same thing)."""
COMPLETION_LOGPROBS = 5
"""OpenAI's limit on the legacy completions' `logprobs` (an integer there, a boolean in chat)."""
COSTED = frozenset({*SCHEMA_KEYS, *TOP_PROBABILITIES, "logprobs"})
"""What `engine_cost_issues` reads: a body naming none of these has none."""


def engine_cost_issues(body: dict[str, object], endpoint: str) -> Iterator[LineIssue]:
    yield from _schema_total_issues(body)
    for name, limit in TOP_PROBABILITIES.items():
        value = body.get(name)
        if value is not None and not _within(value, limit):
            yield LineIssue("invalid_body", f"{name} must be an integer from 0 to {limit}.", f"body.{name}")
    logprobs = body.get("logprobs")
    if logprobs is None or isinstance(logprobs, bool):
        return
    if endpoint == "/v1/completions":
        if not _within(logprobs, COMPLETION_LOGPROBS):
            yield LineIssue("invalid_body", f"logprobs must be an integer from 0 to {COMPLETION_LOGPROBS}.",
                            "body.logprobs")
    elif endpoint == "/v1/chat/completions":
        yield LineIssue("invalid_body", "logprobs must be true or false (top_logprobs says how many).",
                        "body.logprobs")


def _schema_total_issues(body: dict[str, object]) -> Iterator[LineIssue]:
    """Each schema's issues, then those of all of the line's schemas together."""
    enum_values = properties = repeats = 0
    for key, schema in _schemas(body):
        sizes = yield from _schema_issues(f"body.{key}", schema)
        enum_values, properties, repeats = enum_values + sizes[0], properties + sizes[1], repeats + sizes[2]
    totals = (
        (repeats, MAX_PATTERN_REPEATS, f"The line's schema patterns repeat to {repeats} copies in all (the bounds of "
         f"their {{n}}, {{m,}} and {{m,n}} summed); this service takes at most {MAX_PATTERN_REPEATS} in a line "
         f"({WHY})."),
        (enum_values, MAX_ENUM_VALUES, f"The line's schemas list {enum_values} enum values; this service takes at "
         f"most {MAX_ENUM_VALUES} in a line (OpenAI 1,000; {WHY})."),
        (properties, MAX_PROPERTIES, f"The line's schemas name {properties} properties; this service takes at most "
         f"{MAX_PROPERTIES} in a line (OpenAI 5,000; {WHY})."))
    for total, limit, message in totals:
        if total > limit:
            yield LineIssue("invalid_body", message, f"body.{_first_key(body)}")


def _within(value: object, limit: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= limit


def _schemas(body: dict[str, object]) -> Iterator[tuple[str, object]]:
    """(where, schema) of each JSON schema the body asks the engine to follow."""
    response_format = body.get("response_format")
    if isinstance(response_format, dict):
        named = response_format.get("json_schema")
        if isinstance(named, dict) and "schema" in named:
            yield "response_format", named["schema"]
        if "schema" in response_format:  # llama.cpp's own spelling
            yield "response_format", response_format["schema"]
    text = body.get("text")
    text_format = text.get("format") if isinstance(text, dict) else None
    if isinstance(text_format, dict) and "schema" in text_format:
        yield "text", text_format["schema"]
    tools = body.get("tools")
    for tool in tools if isinstance(tools, list) else ():
        function = tool.get("function") if isinstance(tool, dict) else None
        holder = function if isinstance(function, dict) else tool
        if isinstance(holder, dict) and "parameters" in holder:
            yield "tools", holder["parameters"]


def _first_key(body: dict[str, object]) -> str:
    return next(key for key in SCHEMA_KEYS if key in body)


def _schema_issues(param: str, schema: object) -> Generator[LineIssue, None, tuple[int, int, int]]:
    """The issues of one schema; returns its enum values, properties and pattern repeats, counted for the line."""
    size = len(orjson.dumps(schema))
    if size > MAX_SCHEMA_BYTES:
        yield LineIssue("invalid_body", f"A schema in {param} is {size} bytes of JSON; this service takes at most "
                        f"{MAX_SCHEMA_BYTES} per schema ({WHY}).", param)
        return 0, 0, 0
    enum_values = properties = widest = repeats = 0
    stack = [schema]
    while stack:
        item = stack.pop()
        if not isinstance(item, dict):
            continue
        enum = item.get("enum")
        if isinstance(enum, list):
            enum_values += len(enum)
        for pattern in _patterns(item):
            repeats += yield from _pattern_issues(pattern, param)
        named = item.get("properties")
        if isinstance(named, dict):
            properties += len(named)
            widest = max(widest, len(named))
        stack.extend(_subschemas(item))
    if widest > MAX_OBJECT_PROPERTIES:
        yield LineIssue("invalid_body", f"An object of a schema in {param} names {widest} properties; this service "
                        f"takes at most {MAX_OBJECT_PROPERTIES} per object ({WHY}).", param)
    return enum_values, properties, repeats


def pattern_repeats(pattern: str) -> int:
    """The bounds of a pattern's counted quantifiers summed (`a{3}` 3, `a{2,}` 2, `a{0,1999}` 1999)."""
    return pattern_shape(pattern)[2]


_COUNTED = re.compile(r"\{(\d{1,9})(?:,(\d{0,9}))?\}")


def _subschemas(schema: dict[object, object]) -> Iterator[object]:
    """The schemas inside `schema`, by its keywords (never its data: `default`, `const`, `examples`)."""
    for keyword in SUBSCHEMA_LISTS:
        listed = schema.get(keyword)
        if isinstance(listed, list):
            yield from listed
    for keyword in SUBSCHEMA_MAPS:
        mapped = schema.get(keyword)
        if isinstance(mapped, dict):
            yield from mapped.values()
    for keyword in SUBSCHEMAS:
        if keyword in schema:
            inner = schema[keyword]
            if isinstance(inner, list):  # `items` as a list (an older draft's tuple form)
                yield from inner
            else:
                yield inner


def _patterns(schema: dict[object, object]) -> Iterator[str]:
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        yield pattern
    by_pattern = schema.get("patternProperties")
    if isinstance(by_pattern, dict):
        yield from (name for name in by_pattern if isinstance(name, str))


def pattern_shape(pattern: str) -> tuple[int, bool, int]:
    """(quantifiers, whether a group is repeated, the bounds of its counted quantifiers summed) of a regular
    expression: escapes and character classes read as the single characters they match; `?` opening a group's options
    (`(?:`) and one making a quantifier lazy are not quantifiers; a group is repeated when its `)` is followed by `*`,
    `+` or `{n`; `{n}` counts n, `{m,}` m and `{m,n}` n."""
    quantifiers, repeated, at, depth, repeats = 0, False, 0, 0, 0
    closed_group = False
    while at < len(pattern):
        char = pattern[at]
        follows_group, closed_group = closed_group, False
        if char == "\\":
            at += 2
            continue
        if char == "[":
            at = _class_end(pattern, at + 1)
            continue
        if char == "(":
            depth += 1
            at += 2 if pattern.startswith("?", at + 1) else 1
            continue
        if char == ")" and depth:
            depth -= 1
            closed_group = True
        elif char in "*+" or (char == "{" and pattern[at + 1:at + 2].isdigit()):
            quantifiers += 1
            repeated = repeated or follows_group
            if char == "{" and (counted := _COUNTED.match(pattern, at)):
                repeats += int(counted.group(2) or counted.group(1))
        elif char == "?" and at and pattern[at - 1] not in "*+?}":
            quantifiers += 1
        at += 1
    return quantifiers, repeated, repeats


def _class_end(pattern: str, at: int) -> int:
    """Where the character class opened just before `at` ends (past its `]`; a `]` first is a member)."""
    if pattern.startswith("^", at):
        at += 1
    if pattern.startswith("]", at):
        at += 1
    while at < len(pattern) and pattern[at] != "]":
        at += 2 if pattern[at] == "\\" else 1
    return at + 1


def _pattern_issues(pattern: str, param: str) -> Generator[LineIssue, None, int]:
    """The pattern's issues; returns its counted repeats (for the line's total), from the same one walk."""
    quantifiers, repeated, repeats = pattern_shape(pattern)
    if len(pattern) > MAX_PATTERN_CHARS:
        yield LineIssue("invalid_body", f"A schema pattern of {len(pattern)} characters in {param}: this service "
                        f"takes at most {MAX_PATTERN_CHARS} ({WHY}).", param)
    elif repeated:
        yield LineIssue("invalid_body", f"The schema pattern {pattern[:80]!r} repeats a group ((…)*, (…)+ or (…){{n}}),"
                        f" which the engine cannot follow in bounded time; repeat single characters or classes "
                        "instead ((…)? is fine).", param)
    elif quantifiers > MAX_PATTERN_QUANTIFIERS:
        yield LineIssue("invalid_body", f"The schema pattern {pattern[:80]!r} has {quantifiers} quantifiers; this "
                        f"service takes at most {MAX_PATTERN_QUANTIFIERS} ({WHY}).", param)
    return repeats
