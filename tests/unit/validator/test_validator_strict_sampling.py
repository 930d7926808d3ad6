"""A catalogue model with strict sampling (Reliquary's rules): one sampling per file, Reliquary's ranges, and the
parameters that change the draw only at their neutral value. Off by default: the same lines pass on other models."""

import orjson
import pytest

from contracts.catalogue import Catalogue
from services.runtime.storage.catalogue import load_catalogue
from services.validator.domain import FileValidation

CHAT = "/v1/chat/completions"
SAMPLING = {"max_tokens": 64, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "seed": 7}


@pytest.fixture(scope="module")
def strict() -> Catalogue:
    default = load_catalogue(None)
    return Catalogue(models=[m.model_copy(update={"strict_sampling": True}) if m.id.startswith("smollm2-135m-inst")
                             else m for m in default.models])


def line(custom_id: str, **body: object) -> bytes:
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": CHAT, "body": {
        "model": "smollm2", "messages": [{"role": "user", "content": "Name a colour."}], **body}})


def found(catalogue: Catalogue, **body: object) -> list[tuple[str, str | None]]:
    return [(i.code, i.param) for i in FileValidation(CHAT, catalogue).feed(1, line("a", **body))]


def test_reliquarys_walkthrough_lines_pass_and_share_one_sampling(strict: Catalogue) -> None:
    validation = FileValidation(CHAT, strict)
    assert validation.feed(1, line("q1", **SAMPLING, chat_template_kwargs={"enable_thinking": False})) == []
    assert validation.feed(2, line("q2", **SAMPLING, chat_template_kwargs={"enable_thinking": False})) == []
    assert validation.finish() == [] and validation.passed


@pytest.mark.parametrize(("body", "expected"), [
    ({"temperature": 0}, ("greedy_unavailable", "body.temperature")),
    ({"temperature": 4.5}, ("invalid_body", "body.temperature")),
    ({"top_p": 0}, ("invalid_body", "body.top_p")),
    ({"top_k": -2}, ("invalid_body", "body.top_k")),
    ({"min_p": 1}, ("invalid_body", "body.min_p")),
    ({"max_tokens": 8}, ("invalid_max_tokens", "body.max_tokens")),
    ({"max_tokens": 64, "max_completion_tokens": 32}, ("max_tokens_conflict", "body.max_completion_tokens")),
    ({"seed": 2**53}, ("invalid_body", "body.seed")),
    ({"stop": ["\n"]}, ("stop_unavailable", "body.stop")),
    ({"logprobs": True}, ("logprobs_unavailable", "body.logprobs")),
    ({"presence_penalty": 0.5}, ("presence_penalty_unavailable", "body.presence_penalty")),
])
def test_each_strict_rule_has_its_code_and_param(strict: Catalogue, body: dict[str, object],
                                                  expected: tuple[str, str]) -> None:
    assert found(strict, **body) == [expected]


def test_neutral_values_and_temperatures_up_to_four_are_accepted(strict: Catalogue) -> None:
    assert found(strict, temperature=3.5, stop=[], logprobs=False, presence_penalty=0, top_k=0, n=64) == []


def test_a_file_mixing_samplings_fails_with_mixed_sampling_at_the_first_line_that_differs(strict: Catalogue) -> None:
    validation = FileValidation(CHAT, strict)
    assert validation.feed(1, line("a", **SAMPLING)) == []
    assert validation.feed(2, line("b", **SAMPLING)) == []
    omitted = {key: value for key, value in SAMPLING.items() if key != "temperature"}  # the default 1 is another
    mixed = validation.feed(3, line("c", **omitted))
    assert [i.code for i in mixed] == ["mixed_sampling"] and "line 1" in mixed[0].message
    assert validation.feed(4, line("d", **{**SAMPLING, "seed": 8}))[0].code == "mixed_sampling"
    assert "mixed_sampling" in validation.file_issues and not validation.passed


def test_off_by_default_the_same_lines_follow_openais_rules(strict: Catalogue) -> None:
    default = load_catalogue(None)
    assert found(default, stop=["\n"], max_tokens=8) == []
    assert found(default, temperature=3) == [("invalid_body", "body.temperature")]
    validation = FileValidation(CHAT, default)
    assert validation.feed(1, line("a", temperature=0.2)) == [] and validation.feed(2, line("b")) == []
