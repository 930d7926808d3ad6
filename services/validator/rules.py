"""Rules for one line of a batch input file on its own: JSON, the four fields, custom_id, method, url, body."""

from collections.abc import Iterator
from dataclasses import dataclass

import orjson

from contracts.api.request_line import MAX_CUSTOM_ID_LENGTH, MAX_NESTING_DEPTH, REQUIRED_LINE_FIELDS
from contracts.catalogue import Catalogue, CatalogueModel
from services.validator.adapters.tokenizer import TokenizerCache
from services.validator.body_rules import ContextNeed, check_body
from services.validator.issues import LineIssue
from services.validator.plain_lines import CHAT, LINE_FIELDS, PlainChat
from services.validator.strict_sampling import SamplingKey


@dataclass(slots=True)
class LineVerdict:
    """A line's own issues, and what file-level rules need from it. (Not changed once made; not frozen, as a frozen
    dataclass takes a microsecond more to make, every line.)"""

    issues: list[LineIssue]
    custom_id: str | None = None
    model: CatalogueModel | None = None
    embedding_inputs: int = 0
    context: ContextNeed | None = None
    sampling: SamplingKey | None = None
    """How the line samples, for a model with strict sampling (one sampling per file)."""


def check_line(raw: bytes, endpoint: str, catalogue: Catalogue, max_line_bytes: int,
               tokenizers: TokenizerCache | None = None, line_model: str | None = None,
               plain: PlainChat | None = None) -> LineVerdict:
    """One line on its own. `line_model`: the model of a body without one. `plain`: passes a plain chat line."""
    if len(raw) > max_line_bytes:
        # Not its size: a line read in pieces comes as a stand-in once past the limit (adapters/input_lines.py).
        return LineVerdict([LineIssue("invalid_json_line", f"The line is longer than the limit of {max_line_bytes} "
                                      "bytes. Shorten the request or split it.")])
    try:
        line = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        return LineVerdict([LineIssue("invalid_json", f"The line is not valid JSON ({error}). Each line must be "
                                      "one complete JSON object; check for trailing commas, unescaped quotes or a "
                                      "request split across lines.")])
    # A plain line nests four levels (line, body, messages, message): never too deep, so it is looked at first.
    if plain is not None and endpoint == CHAT and (found := plain.check(line)):
        plain_id, model, context = found
        return LineVerdict([], plain_id, model, 0, context)
    custom_id = line.get("custom_id") if isinstance(line, dict) else None
    usable_id = custom_id if isinstance(custom_id, str) and 0 < len(custom_id) <= MAX_CUSTOM_ID_LENGTH else None
    openers = raw.count(b"{") + raw.count(b"[")  # nests no deeper than it opens (strings' brackets count too)
    if openers > MAX_NESTING_DEPTH and (depth := nesting_depth(line, MAX_NESTING_DEPTH)) > MAX_NESTING_DEPTH:
        return LineVerdict([LineIssue("nesting_too_deep", f"The line nests arrays and objects more than "
                                      f"{MAX_NESTING_DEPTH} levels deep (at least {depth}); flatten it.")], usable_id)
    if not isinstance(line, dict):
        return LineVerdict([LineIssue("not_an_object", "Each line must be a JSON object with custom_id, method, "
                                      "url and body.")])
    issues = list(_structure_issues(line, endpoint))
    body = line.get("body")
    if not isinstance(body, dict):
        return LineVerdict(issues, usable_id)
    verdict = check_body(body, endpoint, catalogue, tokenizers, line_model, count_context=not issues)
    all_issues = issues + verdict.issues
    return LineVerdict(all_issues, usable_id, verdict.model if not all_issues else None, verdict.embedding_inputs,
                       verdict.context if not all_issues else None, verdict.sampling if not all_issues else None)


def _structure_issues(line: dict[str, object], endpoint: str) -> Iterator[LineIssue]:
    for field in REQUIRED_LINE_FIELDS:
        if field not in line:
            yield LineIssue("missing_field", f"The line has no `{field}`. Every line needs custom_id, method, url "
                            "and body.", field)
    unknown = sorted(line.keys() - LINE_FIELDS)
    if unknown:
        yield LineIssue("unknown_fields", f"Unknown top-level field(s) {', '.join(unknown)}: request parameters "
                        "belong inside `body`.", unknown[0])
    custom_id = line.get("custom_id")
    if "custom_id" in line and (not isinstance(custom_id, str) or not custom_id):
        yield LineIssue("invalid_custom_id", "custom_id must be a non-empty string.", "custom_id")
    elif isinstance(custom_id, str) and len(custom_id) > MAX_CUSTOM_ID_LENGTH:
        yield LineIssue("invalid_custom_id", f"custom_id is {len(custom_id)} characters; the limit is "
                        f"{MAX_CUSTOM_ID_LENGTH}.", "custom_id")
    if "method" in line and line["method"] != "POST":
        yield LineIssue("invalid_method", f"method must be \"POST\", not {line['method']!r}.", "method")
    if "url" in line and line["url"] != endpoint:
        yield LineIssue("url_mismatch", f"url is {line['url']!r} but the batch endpoint is {endpoint!r}; every line "
                        "must use the batch's endpoint.", "url")
    if "body" in line and not isinstance(line["body"], dict):
        yield LineIssue("invalid_body", "body must be a JSON object: the request for the endpoint.", "body")


def nesting_depth(value: object, limit: int) -> int:
    """How deep arrays and objects nest in `value` (a scalar: 0), counted no further than `limit` + 1. Iterative: a
    line orjson parses (up to 1,024 levels) would overflow Python's recursion limit."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return deepest
