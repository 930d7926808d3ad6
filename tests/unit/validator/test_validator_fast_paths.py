"""The validator's shortcuts give the verdicts the full rules give: a prompt's size settled from a counted head, the
rules a body's fields cannot trigger skipped, a refused line's prompt left uncounted, a file checked in one thread
with its findings handed over in batches, and the error-file lines written from a template."""

import random
import threading
from collections.abc import Iterator

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.catalogue import Catalogue
from services.runtime.storage.catalogue import load_catalogue
from services.validator.adapters.tokenizer import ModelTokenizer, TokenizerCache
from services.validator.body_rules import (
    _SHAPES,
    BodyVerdict,
    _embedding_inputs,
    _modality_issues,
    _model_issues,
    _parameter_issues,
    _range_issues,
    _template_kwarg_issues,
    _token_id_issues,
    check_body,
    context_need,
    is_token_ids,
)
from services.validator.domain import FileValidation, Limits, LineResult
from services.validator.engine_cost_rules import engine_cost_issues
from services.validator.file_check import WINDOW_LINES, FileCheck, Findings
from services.validator.issues import LineIssue
from services.validator.plain_lines import PlainChat
from services.validator.refusals import NotRunLines, not_run_output, rejected_line
from services.validator.rules import check_line
from services.validator.strict_sampling import sampling_key, strict_issues
from services.validator.tool_rules import tool_issues
from tests.unit.validator.test_validator_each_rule import RULES, good

CATALOGUE: Catalogue = load_catalogue(None)
STRICT = Catalogue(models=[m.model_copy(update={"strict_sampling": True}) for m in CATALOGUE.models])
TOKENIZERS = TokenizerCache()
CHAT = "/v1/chat/completions"
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
WORDS = ("batch request model token latency stream queue memory system prompt <|im_start|> <|im_end|> "
         "naïve café 東京 émoji🙂 don't it's 42 3.14 ... !!").split()


def tokenizer() -> ModelTokenizer:
    found = TOKENIZERS.get(CATALOGUE.models[0])
    assert isinstance(found, ModelTokenizer)
    return found


# -- a prompt's size -------------------------------------------------------------------------------------------------

SPELLABLE = st.characters(exclude_categories=("Cc", "Cs"), max_codepoint=0x3FFFF)
"""Characters whose bytes the vocabulary holds (tiktoken cannot count a byte it has no token for)."""
TEXTS = st.lists(st.sampled_from(WORDS) | st.text(SPELLABLE, max_size=6),
                 min_size=1, max_size=400).flatmap(
    lambda words: st.lists(st.sampled_from([" ", " ", " ", "  ", "\n", " \n", "\t", ""]), min_size=len(words),
                           max_size=len(words)).map(lambda gaps: "".join(w + g for w, g in zip(words, gaps,
                                                                                               strict=True))))


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(TEXTS, st.integers(-3, 3), st.integers(0, 3000))
def test_a_prompt_fits_from_its_head_exactly_when_it_fits_counted_whole(text: str, near: int, anywhere: int) -> None:
    model = tokenizer()
    exact = model.count_text(text)
    assert model.count_fast(text) == exact
    for room in (exact + near, anywhere, exact // 2):
        assert model.fits(text, room) is (exact <= room), (text, room)


CONTENTS = st.lists(st.sampled_from([*WORDS, "system", "<|im_end|>", "<|im", "sys", "<", "\n", " "]),
                    max_size=12).map("".join)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["system", "user", "assistant"]), CONTENTS), min_size=1, max_size=4))
def test_a_chat_spliced_into_its_skeleton_is_the_chat_the_template_renders(turns: list[tuple[str, str]]) -> None:
    model = tokenizer()
    messages: list[dict[str, object]] = [{"role": role, "content": content} for role, content in turns]
    assert model.render_chat(messages) == model._render(messages, [content for _, content in turns], None)


def test_a_long_prompt_of_common_words_is_settled_at_its_exact_count() -> None:
    rng = random.Random(3)
    text = "<|im_start|>user\n" + " ".join(rng.choice(WORDS[:10]) for _ in range(600)) + "<|im_end|>\n"
    model = tokenizer()
    exact = model.count_text(text)
    assert len(text.encode()) > exact + 1000, "the head's count settles it, not the text's size"
    assert model.fits(text, exact) and not model.fits(text, exact - 1)


# -- rules a body's fields cannot trigger ----------------------------------------------------------------------------

def full_body_verdict(body: dict[str, object], endpoint: str, catalogue: Catalogue,
                      tokenizers: TokenizerCache | None, line_model: str | None) -> BodyVerdict:
    """`check_body` as it was before its shortcuts: every rule run on every body, every prompt counted."""
    issues, model = _model_issues(body, endpoint, catalogue, line_model)
    if body.get("stream") not in (None, False):
        issues.append(LineIssue("stream_not_supported", "Batch requests cannot stream: remove body.stream or set "
                                "it to false.", "body.stream"))
    shape = list(_SHAPES[endpoint](body)) if endpoint in _SHAPES else []
    issues += shape
    strict = model is not None and model.strict_sampling
    issues += _range_issues(body, temperature_checked=strict)
    issues += engine_cost_issues(body, endpoint)
    need = None
    if strict:
        issues += strict_issues(body)
    if model is not None:
        issues += _parameter_issues(body, endpoint, model)
        issues += tool_issues(body, endpoint, model, tokenizers)
        issues += _modality_issues(body, endpoint, model)
        issues += _template_kwarg_issues(body, endpoint, model, tokenizers)
        prompt = body.get("prompt")
        if endpoint == "/v1/completions" and is_token_ids(prompt):
            assert isinstance(prompt, list)
            issues += _token_id_issues(prompt, body, model, tokenizers)
        elif not shape and tokenizers is not None:
            need = context_need(body, endpoint, model, tokenizers)
    return BodyVerdict(issues, model if not issues else None, _embedding_inputs(body, endpoint), need,
                       sampling_key(body) if strict else None)


def same_verdict(body: dict[str, object], endpoint: str, catalogue: Catalogue) -> None:
    fast = check_body(body, endpoint, catalogue, TOKENIZERS)
    full = full_body_verdict(body, endpoint, catalogue, TOKENIZERS, None)
    assert fast.issues == full.issues
    assert (fast.model, fast.embedding_inputs, fast.sampling) == (full.model, full.embedding_inputs, full.sampling)
    if not full.issues:  # a refused line's prompt is never counted: its verdict drops the count
        assert fast.context == full.context


def good_bodies() -> Iterator[tuple[str, dict[str, object]]]:
    """A good body of every endpoint, and each with the parameters lines commonly carry."""
    text = " ".join(WORDS[:10] * 40)
    common: dict[str, object] = {"max_tokens": 16, "temperature": 0.7, "top_p": 0.9, "seed": 7, "stop": ["\n"],
                                 "n": 2, "tools": [], "tool_choice": "auto", "chat_template_kwargs": {}, "user": "u"}
    bodies: list[dict[str, object]] = [
        {"model": "smollm2", "messages": [{"role": "system", "content": "Be brief."},
                                          {"role": "user", "content": text}]},
        {"model": "smollm2", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}]
    for body in bodies:
        yield "/v1/chat/completions", body
        yield "/v1/chat/completions", {**body, **common}
    yield "/v1/completions", {"model": "smollm2", "prompt": text, "max_tokens": 1900}
    yield "/v1/completions", {"model": "smollm2", "prompt": [1, 2, 3], "max_tokens": 8, "temperature": 1}
    yield "/v1/completions", {"model": "smollm2", "prompt": ["a b", text]}
    yield "/v1/embeddings", {"model": "smollm2-135m-embed", "input": ["one", "two"], "encoding_format": "float"}
    yield "/v1/embeddings", {"model": "smollm2-135m-embed", "input": text}
    yield "/v1/responses", {"model": "smollm2", "input": text, "instructions": "Be brief.", "max_output_tokens": 64}
    yield "/v1/responses", {"model": "smollm2", "input": [{"role": "user", "content": "hi"}], "temperature": 0}


@pytest.mark.parametrize("catalogue", [CATALOGUE, STRICT], ids=["catalogue", "strict-sampling"])
def test_good_bodies_of_every_endpoint_get_the_full_rules_verdict(catalogue: Catalogue) -> None:
    for endpoint, body in good_bodies():
        same_verdict(body, endpoint, catalogue)


@pytest.mark.parametrize(("code", "change", "param"), RULES, ids=[f"{c}:{p}" for c, _, p in RULES])
def test_each_kind_of_bad_line_gets_the_full_rules_verdict(code: str, change: object, param: str | None) -> None:
    line = change(good())  # type: ignore[operator]
    body = line.get("body") if isinstance(line, dict) else None
    if isinstance(body, dict):
        same_verdict(body, "/v1/chat/completions", CATALOGUE)


FIELDS = st.sampled_from(["model", "messages", "prompt", "input", "instructions", "max_tokens", "max_output_tokens",
                          "max_completion_tokens", "temperature", "top_p", "top_k", "min_p", "presence_penalty",
                          "frequency_penalty", "seed", "stop", "n", "stream", "tools", "tool_choice", "logprobs",
                          "chat_template_kwargs", "response_format", "user", "metadata", "logit_bias", "suffix"])
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5000) | st.floats(-3, 3, allow_nan=False) | st.text(max_size=12)
    | st.sampled_from(["smollm2", "smollm2-135m-embed", "auto", "none", "user", "text"]),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(
        st.sampled_from(["role", "content", "type", "text", "enable_thinking", "messages"]), children, max_size=3),
    max_leaves=8)
BODIES = st.dictionaries(FIELDS, VALUES, max_size=7).map(
    lambda body: {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], **body})


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(BODIES, st.sampled_from(ENDPOINTS), st.booleans())
def test_any_body_gets_the_full_rules_verdict(body: dict[str, object], endpoint: str, strict: bool) -> None:
    same_verdict(body, endpoint, STRICT if strict else CATALOGUE)


# -- the plain chat line ---------------------------------------------------------------------------------------------

def same_line_verdict(line: object, catalogue: Catalogue, line_model: str | None = None) -> bool:
    """Checked first as a plain line and checked by every rule, `line` gets one verdict; whether it was plain."""
    raw = orjson.dumps(line)
    plain = PlainChat(catalogue, TOKENIZERS)
    fast = check_line(raw, CHAT, catalogue, 1 << 20, TOKENIZERS, line_model, plain)
    full = check_line(raw, CHAT, catalogue, 1 << 20, TOKENIZERS, line_model)
    assert fast == full
    return plain.check(line) is not None


def test_a_typical_chat_line_is_plain_and_gets_the_full_rules_verdict() -> None:
    text = " ".join(WORDS[:10] * 60)
    line = {"custom_id": "r1", "method": "POST", "url": CHAT,
            "body": {"model": "smollm2", "max_tokens": 128, "temperature": 0.7, "seed": 3, "top_p": 1,
                     "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]}}
    assert same_line_verdict(line, CATALOGUE)
    assert same_line_verdict(good(), CATALOGUE)
    assert not same_line_verdict(good(), STRICT), "a strict-sampling model's lines take every rule"


@pytest.mark.parametrize(("code", "change", "param"), RULES, ids=[f"{c}:{p}" for c, _, p in RULES])
def test_no_bad_line_is_plain_but_one_whose_prompt_is_counted_later(code: str, change: object,
                                                                    param: str | None) -> None:
    assert same_line_verdict(change(good()), CATALOGUE) is (code == "context_too_long")  # type: ignore[operator]


NEAR_VALUES = st.none() | st.booleans() | st.integers(-2, 3000) | st.floats(-1, 3, allow_nan=False) \
    | st.sampled_from(["", "x", "POST", CHAT, "/v1/completions", "smollm2", "smollm2-135m-instruct-q4_1",
                       "smollm2-135m-embed", "gpt-4o", "x" * 513]) | st.lists(st.integers(0, 3), max_size=2)
MESSAGES = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "robot"]) | NEAR_VALUES,
     "content": st.text(max_size=30) | NEAR_VALUES | st.just([{"type": "text", "text": "hi"}])},
    optional={"name": st.text(max_size=3)}), max_size=3)
NEAR_PLAIN_BODIES = st.fixed_dictionaries(
    {}, optional={"model": NEAR_VALUES, "messages": MESSAGES | NEAR_VALUES, "max_tokens": NEAR_VALUES,
                  "max_completion_tokens": NEAR_VALUES, "temperature": NEAR_VALUES, "top_p": NEAR_VALUES,
                  "seed": NEAR_VALUES, "stream": NEAR_VALUES, "n": NEAR_VALUES, "tools": NEAR_VALUES})
NEAR_PLAIN_LINES = st.fixed_dictionaries(
    {}, optional={"custom_id": NEAR_VALUES, "method": NEAR_VALUES, "url": NEAR_VALUES,
                  "body": NEAR_PLAIN_BODIES | NEAR_VALUES, "temperature": NEAR_VALUES})
LINES = NEAR_PLAIN_LINES | st.fixed_dictionaries(
    {"custom_id": st.text(min_size=1, max_size=8), "method": st.just("POST"), "url": st.just(CHAT),
     "body": st.fixed_dictionaries({"model": st.sampled_from(["smollm2", "smollm2-135m-embed"]),
                                    "messages": MESSAGES},
                                   optional={"max_tokens": NEAR_VALUES, "temperature": NEAR_VALUES,
                                             "top_p": NEAR_VALUES, "seed": NEAR_VALUES})})


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(LINES, st.booleans(), st.sampled_from([None, "smollm2"]))
def test_any_chat_line_gets_one_verdict_whether_checked_as_plain_or_by_every_rule(
        line: dict[str, object], strict: bool, line_model: str | None) -> None:
    same_line_verdict(line, STRICT if strict else CATALOGUE, line_model)


# -- a file checked in one thread ------------------------------------------------------------------------------------

def corpus(lines: int) -> list[bytes]:
    """Good lines and every kind of bad line the rule tests know, blank lines and a duplicate or two among them."""
    rng = random.Random(lines)
    out: list[bytes] = []
    for n in range(1, lines + 1):
        pick = rng.random()
        if pick < 0.02:
            out.append(b"")
        elif pick < 0.04:
            out.append(b'{"custom_id": "broken"')
        elif pick < 0.06:
            out.append(orjson.dumps(good("c1")))
        elif pick < 0.3:
            _, change, _ = rng.choice(RULES)
            out.append(orjson.dumps(change(good(f"c{n}"))))
        else:
            out.append(orjson.dumps(good(f"c{n}")))
    return out


def checked_window_by_window(lines: list[bytes], limits: Limits) -> tuple[list[LineResult], FileValidation]:
    validation = FileValidation("/v1/chat/completions", CATALOGUE, limits, TOKENIZERS)
    numbered = list(enumerate(lines, start=1))
    results = [result for start in range(0, len(numbered), WINDOW_LINES)
               for result in validation.check_window(numbered[start:start + WINDOW_LINES]) if result.issues]
    return results, validation


def chunked(lines: list[bytes], sizes: list[int]) -> Iterator[list[bytes]]:
    start = 0
    for size in sizes:
        yield lines[start:start + size]
        start += size
    yield lines[start:]


@pytest.mark.parametrize("limits", [Limits(), Limits(max_lines=600), Limits(inherit_line_model=True)],
                         ids=["default", "line-limit", "inherited-model"])
def test_a_file_checked_in_one_thread_finds_what_checking_its_windows_in_order_finds(limits: Limits) -> None:
    lines = corpus(3 * WINDOW_LINES + 41)
    expected, in_order = checked_window_by_window(lines, limits)
    validation = FileValidation("/v1/chat/completions", CATALOGUE, limits, TOKENIZERS)
    found: list[Findings] = []
    sizes = [random.Random(7).randint(0, 300) for _ in range(6)]
    FileCheck(validation, found.append, threading.Event()).run(chunked(lines, sizes))
    assert [result for findings in found for result, _ in findings.refused] == expected
    assert all(record == rejected_line(result) for findings in found for result, record in findings.refused)
    assert (found[-1].lines_read, found[-1].errors_found) == (in_order.total_lines, in_order.error_count)
    assert validation.counts_by_code == in_order.counts_by_code and validation.model_id == in_order.model_id


# -- error-file lines ------------------------------------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40) | st.none(), st.integers(1, 10**6), st.booleans(), st.text(max_size=80))
def test_a_line_that_did_not_run_is_written_as_the_model_writes_it(custom_id: str | None, line: int, checked: bool,
                                                                  message: str) -> None:
    raw = orjson.dumps({"custom_id": custom_id, "method": "POST"})
    expected = not_run_output("batch_x", line, raw, message, checked).model_dump_json().encode()
    lines = NotRunLines("batch_x", message)
    assert lines.line(line, custom_id, checked) == expected
    assert lines.of_raw(line, raw, checked) == expected



@pytest.mark.parametrize("role", [["user"], {"user": 1}], ids=["list", "object"])
def test_a_role_that_is_no_string_is_refused_like_any_unknown_role(role: object) -> None:
    line = {**good(), "body": {"model": "smollm2", "messages": [{"role": role, "content": "hi"}]}}
    found = FileValidation(CHAT, CATALOGUE, tokenizers=TOKENIZERS).check(1, orjson.dumps(line))
    assert [(issue.code, issue.param) for issue in found.issues] == [("invalid_body", "body.messages[0].role")]
