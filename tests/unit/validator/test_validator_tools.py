"""Tools are run or refused, never accepted and dropped: a line offering tools (or asking for a tool call) to a model
that cannot call them is `tools_unavailable`; no tools at all is neutral. SmolLM2's chat template never reads
`tools`, and the shipped catalogue says so."""

import orjson
import pytest

from contracts.api.error_codes import TOOLS_UNAVAILABLE
from contracts.catalogue import Catalogue, CatalogueModel
from services.gateway.views.models import as_model
from services.validator.adapters.tokenizer import TokenizerCache
from services.validator.domain import FileValidation

CHAT, RESPONSES = "/v1/chat/completions", "/v1/responses"
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}}}}}


def smollm2(catalogue: Catalogue) -> CatalogueModel:
    model = catalogue.resolve("smollm2")
    assert model is not None
    return model


def issues(catalogue: Catalogue, body: dict[str, object], endpoint: str = CHAT,
           tokenizers: TokenizerCache | None = None) -> list[tuple[str, str | None]]:
    model = next(m for m in catalogue.models if endpoint in m.endpoints)
    prompt = {"messages": [{"role": "user", "content": "Weather in Paris?"}]} if endpoint == CHAT else {
        "input": "Weather in Paris?"}
    line = {"custom_id": "a", "method": "POST", "url": endpoint, "body": {"model": model.id, **prompt, **body}}
    found = FileValidation(endpoint, catalogue, tokenizers=tokenizers).feed(1, orjson.dumps(line))
    return [(issue.code, issue.param) for issue in found]


def with_tools(catalogue: Catalogue) -> Catalogue:
    """The shipped catalogue with SmolLM2's entry claiming tool support."""
    return Catalogue(models=[m.model_copy(update={"supports_tools": True}) if m.id.startswith("smollm2-135m-inst")
                             else m for m in catalogue.models])


def test_smollm2s_chat_template_never_reads_tools_and_its_catalogue_entry_says_so(
        catalogue: Catalogue, tokenizers: TokenizerCache) -> None:
    model = smollm2(catalogue)
    tokenizer = tokenizers.get(model)
    assert tokenizer is not None and "messages" in tokenizer.template_variables
    assert "tools" not in tokenizer.template_variables
    assert model.supports_tools is False
    assert as_model(model).supports_tools is False, "GET /v1/models shows the capability"


@pytest.mark.parametrize(("body", "param"), [
    ({"tools": [WEATHER]}, "body.tools"),
    ({"tools": [WEATHER], "tool_choice": "required"}, "body.tools"),
    ({"tools": [WEATHER], "tool_choice": "auto", "parallel_tool_calls": False}, "body.tools"),
    ({"tool_choice": "required"}, "body.tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, "body.tool_choice"),
], ids=["tools", "tools-required", "tools-auto", "required-alone", "named-function"])
def test_a_line_offering_tools_to_a_model_that_cannot_call_them_is_tools_unavailable(
        catalogue: Catalogue, body: dict[str, object], param: str) -> None:
    assert issues(catalogue, body) == [(TOOLS_UNAVAILABLE, param)]


def test_the_refusal_says_why_and_what_is_accepted(catalogue: Catalogue) -> None:
    line = {"custom_id": "a", "method": "POST", "url": CHAT, "body": {
        "model": "smollm2", "messages": [{"role": "user", "content": "?"}], "tools": [WEATHER]}}
    [issue] = FileValidation(CHAT, catalogue).feed(1, orjson.dumps(line))
    assert "smollm2-135m-instruct-q4_1 cannot call tools" in issue.message
    assert "plain text without tool_calls" in issue.message and 'tool_choice "none"' in issue.message


@pytest.mark.parametrize("body", [
    {"tools": []}, {"tool_choice": "none"}, {"tool_choice": "auto"}, {"tools": [], "tool_choice": "none"},
    {"tools": None, "tool_choice": None}, {"parallel_tool_calls": True}, {"parallel_tool_calls": False},
], ids=str)
def test_no_tools_at_all_is_neutral_and_accepted(catalogue: Catalogue, body: dict[str, object]) -> None:
    assert issues(catalogue, body) == []


def test_a_model_declaring_tools_whose_template_reads_them_takes_tool_lines(catalogue: Catalogue) -> None:
    """Without a tokenizer to read the template, the catalogue's declaration decides."""
    assert issues(with_tools(catalogue), {"tools": [WEATHER], "tool_choice": "required"}) == []


def test_a_catalogue_claim_the_chat_template_contradicts_is_still_refused(
        catalogue: Catalogue, tokenizers: TokenizerCache) -> None:
    claimed = with_tools(catalogue)
    assert issues(claimed, {"tools": [WEATHER]}, tokenizers=tokenizers) == [(TOOLS_UNAVAILABLE, "body.tools")]
    line = {"custom_id": "a", "method": "POST", "url": CHAT, "body": {
        "model": "smollm2", "messages": [{"role": "user", "content": "?"}], "tools": [WEATHER]}}
    [issue] = FileValidation(CHAT, claimed, tokenizers=tokenizers).feed(1, orjson.dumps(line))
    assert "chat template never reads `tools`" in issue.message


def test_responses_lines_with_tools_are_refused_even_for_a_tool_model(catalogue: Catalogue) -> None:
    """The Responses endpoint runs as a chat without tools: it would answer text and drop them."""
    assert issues(with_tools(catalogue), {"tools": [WEATHER]}, RESPONSES) == [(TOOLS_UNAVAILABLE, "body.tools")]
    assert issues(catalogue, {"tools": [], "tool_choice": "auto"}, RESPONSES) == []


def test_an_engine_that_returns_no_tool_calls_refuses_tools_and_cannot_claim_them() -> None:
    model = CatalogueModel(id="hf", engine="transformers", artifact="/models/x", context_length=1024, memory_bytes=1,
                           endpoints=[CHAT])
    assert issues(Catalogue(models=[model]), {"tools": [WEATHER]}) == [(TOOLS_UNAVAILABLE, "body.tools")]
    with pytest.raises(ValueError, match="returns no tool calls"):
        CatalogueModel(id="trt", engine="tensorrt_llm", artifact="/models/x", context_length=1024, memory_bytes=1,
                       endpoints=[CHAT], supports_tools=True)


def test_tools_that_are_not_a_list_are_an_invalid_body(catalogue: Catalogue) -> None:
    assert issues(catalogue, {"tools": {"type": "function"}}) == [("invalid_body", "body.tools")]


def test_tools_on_an_endpoint_without_them_are_an_unknown_parameter(catalogue: Catalogue) -> None:
    line = {"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {
        "model": "smollm2", "prompt": "Once", "tools": [WEATHER]}}
    found = FileValidation("/v1/completions", catalogue).feed(1, orjson.dumps(line))
    assert [(i.code, i.param) for i in found] == [("unsupported_parameter", "body.tools")]
