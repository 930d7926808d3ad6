"""Parameters an engine honours only from a release on: accepted for a model whose catalogue entry pins
`engine_version` at or above that release, refused with a message that says so otherwise, and a model pinning a later
release than the installed engine's is not served by that executor (it would silently ignore them)."""

import logging

import orjson
import pytest

from contracts.catalogue import Catalogue, CatalogueModel
from contracts.engines import release_at_least
from services.executor.adapters.engines.shelf import servable_at_release
from services.validator.domain import FileValidation

CHAT = "/v1/chat/completions"


def trt_model(engine_version: str | None = None, model_id: str = "llama") -> CatalogueModel:
    return CatalogueModel(id=model_id, engine="tensorrt_llm", artifact="/models/llama", context_length=4096,
                          memory_bytes=1, endpoints=[CHAT], engine_version=engine_version)


def issues_of(model: CatalogueModel, **body: object) -> list[tuple[str, str | None, str]]:
    line = {"custom_id": "a", "method": "POST", "url": CHAT, "body": {
        "model": model.id, "messages": [{"role": "user", "content": "Say hi."}], **body}}
    found = FileValidation(CHAT, Catalogue(models=[model])).feed(1, orjson.dumps(line))
    return [(issue.code, issue.param, issue.message) for issue in found]


def test_release_order_is_pep_440s() -> None:
    assert release_at_least("1.3.0rc24", "1.3.0rc24") and release_at_least("1.3.0", "1.3.0rc24")
    assert not release_at_least("1.3.0rc9", "1.3.0rc24") and not release_at_least("1.2.1", "1.3.0rc24")
    assert not release_at_least("not-installed", "1.0")


def test_a_penalty_is_refused_for_a_model_that_pins_no_release_and_the_message_says_why() -> None:
    [(code, param, message)] = issues_of(trt_model(), frequency_penalty=0.5)
    assert (code, param) == ("frequency_penalty_unavailable", "body.frequency_penalty")
    assert "1.3.0rc24" in message and "engine_version" in message
    assert issues_of(trt_model(), frequency_penalty=0) == []  # the neutral value asks nothing of the sampler


def test_a_penalty_is_accepted_for_a_model_pinned_to_a_release_that_honours_it() -> None:
    assert issues_of(trt_model("1.3.0"), frequency_penalty=0.5, presence_penalty=0.2, min_p=0.05) == []
    assert [code for code, _, _ in issues_of(trt_model("1.2.0"), min_p=0.05)] == ["min_p_unavailable"]


def test_the_catalogue_refuses_an_engine_version_that_is_no_release_number() -> None:
    with pytest.raises(ValueError, match="is not a release number"):
        trt_model("latest")


def test_an_executor_does_not_serve_a_model_pinned_to_a_later_release_than_its_engine(
        caplog: pytest.LogCaptureFixture) -> None:
    models = [trt_model("1.3.0", "new"), trt_model(None, "any"), trt_model("1.2.0", "old")]
    with caplog.at_level(logging.WARNING):
        assert sorted(servable_at_release("1.2.1", models)) == ["any", "old"]
    assert "new is not served here" in caplog.text
    assert sorted(servable_at_release("1.3.0", models)) == ["any", "new", "old"]
    with pytest.raises(ValueError, match=r"new needs 1\.3\.0"):
        servable_at_release("1.2.1", [trt_model("1.3.0", "new")])
