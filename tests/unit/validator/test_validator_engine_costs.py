"""A line may not ask the engine for work every tenant's lines would wait on: a schema pattern that repeats a group
(`(a?){1999}` took llama.cpp minutes per token, on the thread driving every slot), thousands of enum values or
properties (minutes before the first token), a schema past 16 KB, or top log-probabilities past OpenAI's limits
(the whole vocabulary per token: 110 MB each). Ordinary schemas and limits pass."""

from typing import Any

import orjson
import pytest

from contracts.catalogue import Catalogue
from services.validator.adapters.tokenizer import TokenizerCache
from services.validator.domain import FileValidation

CHAT, COMPLETIONS, RESPONSES = "/v1/chat/completions", "/v1/completions", "/v1/responses"


def schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


def chat(**body: Any) -> dict[str, Any]:
    return {"custom_id": "r1", "method": "POST", "url": CHAT,
            "body": {"model": "smollm2", "messages": [{"role": "user", "content": "Give JSON."}], "max_tokens": 8,
                     **body}}


def issues(line: dict[str, Any], catalogue: Catalogue, tokenizers: TokenizerCache) -> list[tuple[str, str | None]]:
    validation = FileValidation(line["url"], catalogue, tokenizers=tokenizers)
    return [(issue.code, issue.param) for issue in validation.check(1, orjson.dumps(line)).issues]


COSTLY = [
    chat(response_format=schema_format({"type": "string", "pattern": "^(a?){1999}$"})),
    chat(response_format=schema_format({"type": "string", "pattern": "^(ab|a)+$"})),
    chat(response_format=schema_format({"type": "string", "pattern": "a?" * 17})),
    chat(response_format=schema_format({"type": "string", "pattern": "a" * 257})),
    chat(response_format=schema_format({"type": "string", "pattern": "a\\\\*" * 17})),
    chat(response_format=schema_format({"enum": [f"v{n}" for n in range(501)]})),
    chat(response_format=schema_format({"type": "object",
                                        "properties": {f"p{n}": {"type": "integer"} for n in range(129)}})),
    chat(response_format=schema_format({"type": "object", "patternProperties": {"^(x)*$": {"type": "string"}}})),
    chat(response_format=schema_format({"description": "x" * 40_000})),
    chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"code": {"type": "string", "pattern": "^([0-9]?){500}$"}}}}}]),
    chat(tools=[{"type": "function", "function": {"name": f"f{n}", "parameters": {  # each within, all past
        "type": "object", "properties": {"pick": {"enum": [f"v{v}" for v in range(100)]}}}}} for n in range(6)]),
]


@pytest.mark.parametrize("line", COSTLY, ids=range(len(COSTLY)))
def test_a_schema_the_engine_cannot_follow_in_bounded_time_is_refused(
        line: dict[str, Any], catalogue: Catalogue, tokenizers: TokenizerCache) -> None:
    key = next(key for key in ("response_format", "tools") if key in line["body"])
    assert ("invalid_body", f"body.{key}") in issues(line, catalogue, tokenizers)


def test_a_responses_text_format_schema_is_bounded_alike(catalogue: Catalogue, tokenizers: TokenizerCache) -> None:
    line = {"custom_id": "r1", "method": "POST", "url": RESPONSES,
            "body": {"model": "smollm2", "input": "Give JSON.", "max_output_tokens": 8,
                     "text": {"format": {"type": "json_schema", "name": "a",
                                         "schema": {"type": "string", "pattern": "^(a?){50}$"}}}}}
    assert issues(line, catalogue, tokenizers) == [("invalid_body", "body.text")]


def test_ordinary_schemas_pass(catalogue: Catalogue, tokenizers: TokenizerCache) -> None:
    schema = {"type": "object", "properties": {
        "phone": {"type": "string", "pattern": r"^(\+\d{1,3})?\d{10}$"},
        "zip": {"type": "string", "pattern": r"^\d{5}(-\d{4})?$"},
        "expression": {"type": "string", "pattern": r"^[0-9()*+\-/ .]+$"},
        "symbols": {"type": "string", "pattern": r"^[+*?][+*?][+*?][+*?][+*?][+*?]$"},
        "options": {"type": "string", "pattern": r"(?:a)(?=b)(?!c)\)+"},
        "country": {"enum": [f"C{n}" for n in range(249)], "default": {"enum": list(range(300))}},
        "currency": {"enum": [f"K{n}" for n in range(30)]},
        **{f"field{n}": {"type": "integer"} for n in range(40)}}, "required": ["phone"]}
    assert issues(chat(response_format=schema_format(schema)), catalogue, tokenizers) == []


def test_many_tools_with_long_descriptions_pass(catalogue: Catalogue, tokenizers: TokenizerCache) -> None:
    """Each tool's parameters are a schema of their own; descriptions are prompt, not grammar."""
    tools = [{"type": "function", "function": {"name": f"tool_{n}", "description": "d" * 2_000, "parameters": {
        "type": "object", "properties": {f"arg{a}": {"type": "string"} for a in range(7)}}}} for n in range(20)]
    assert ("invalid_body", "body.tools") not in issues(chat(tools=tools), catalogue, tokenizers)


@pytest.mark.parametrize(("url", "body", "accepted"), [
    (CHAT, {"logprobs": True, "top_logprobs": 20}, True),
    (CHAT, {"logprobs": True, "top_logprobs": 21}, False),
    (CHAT, {"logprobs": True, "top_logprobs": 100_000}, False),
    (CHAT, {"n_probs": 20}, True),
    (CHAT, {"n_probs": 49_152}, False),
    (CHAT, {"logprobs": 5}, False),
    (COMPLETIONS, {"logprobs": 5}, True),
    (COMPLETIONS, {"logprobs": 100_000}, False),
])
def test_top_log_probabilities_are_within_openais_limits(
        url: str, body: dict[str, Any], accepted: bool, catalogue: Catalogue, tokenizers: TokenizerCache) -> None:
    request: dict[str, Any] = {"model": "smollm2", "max_tokens": 8, **body}
    request.update({"messages": [{"role": "user", "content": "Hi"}]} if url == CHAT else {"prompt": "Hi"})
    found = issues({"custom_id": "r1", "method": "POST", "url": url, "body": request}, catalogue, tokenizers)
    assert (found == []) is accepted, found
