"""A parameter at its neutral value (one that asks nothing of the engine) is accepted on every engine and endpoint
where OpenAI's API or the seeds' has it; any other value an engine cannot honour is still refused."""

import orjson
import pytest

from contracts.catalogue import Catalogue, CatalogueModel
from contracts.engines import NEUTRAL_VALUES, known_parameters
from contracts.events.executor import EngineName
from services.runtime.storage.catalogue import load_catalogue
from services.validator.domain import FileValidation

CHAT, COMPLETIONS, RESPONSES, EMBEDDINGS = "/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings"
PROMPTS: dict[str, dict[str, object]] = {
    CHAT: {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8},
    COMPLETIONS: {"prompt": "Once upon", "max_tokens": 8},
    RESPONSES: {"input": "Say hi.", "max_output_tokens": 8},
    EMBEDDINGS: {"input": "hello"},
}
NEUTRAL: dict[str, list[tuple[str, object]]] = {
    CHAT: [("n", 1), ("logprobs", False), ("top_logprobs", 0), ("presence_penalty", 0), ("frequency_penalty", 0),
           ("presence_penalty", 0.0), ("repetition_penalty", 1), ("repetition_penalty", 1.0), ("min_p", 0),
           ("top_k", -1), ("top_k", 0), ("stream", False), ("parallel_tool_calls", True),
           ("parallel_tool_calls", False),
           ("service_tier", "auto"), ("service_tier", "default"), ("store", False), ("modalities", ["text"]),
           ("logit_bias", {}), ("stop", []), ("response_format", {"type": "text"}), ("tools", []),
           ("tool_choice", "none"), ("tool_choice", "auto"), ("functions", []), ("function_call", "none"),
           ("verbosity", "medium"), ("reasoning_effort", "none"), ("chat_template_kwargs", {}), ("audio", None),
           ("prediction", None), ("web_search_options", None)],
    COMPLETIONS: [("suffix", ""), ("echo", False), ("best_of", 1), ("n", 1), ("logprobs", None),
                  ("presence_penalty", 0), ("frequency_penalty", 0), ("repetition_penalty", 1), ("top_k", 0),
                  ("min_p", 0), ("logit_bias", {}), ("stream", False)],
    RESPONSES: [("tools", []), ("tool_choice", "none"), ("tool_choice", "auto"), ("parallel_tool_calls", True),
                ("truncation", "disabled"), ("background", False), ("include", []), ("store", False),
                ("service_tier", "auto"), ("reasoning", {}), ("reasoning", {"effort": "none"}), ("top_logprobs", 0),
                ("text", {"format": {"type": "text"}}), ("stream", False), ("max_tool_calls", None)],
    EMBEDDINGS: [("encoding_format", "float"), ("dimensions", None), ("user", "u")],
}
CASES = [(endpoint, name, value) for endpoint, pairs in NEUTRAL.items() for name, value in pairs]


def model_on(engine: EngineName, endpoint: str) -> CatalogueModel:
    if engine == "llamacpp":  # the shipped SmolLM2 entries, chat and embeddings
        shipped = load_catalogue(None).resolve("smollm2-embed" if endpoint == EMBEDDINGS else "smollm2")
        assert shipped is not None
        return shipped
    return CatalogueModel(id=f"on-{engine}", engine=engine, artifact="/models/llama", context_length=4096,
                          memory_bytes=1, endpoints=[CHAT, COMPLETIONS, RESPONSES])


def issues(model: CatalogueModel, endpoint: str, **body: object) -> list[tuple[str, str | None]]:
    line = {"custom_id": "a", "method": "POST", "url": endpoint,
            "body": {"model": model.id, **PROMPTS[endpoint], **body}}
    found = FileValidation(endpoint, Catalogue(models=[model])).feed(1, orjson.dumps(line))
    return [(issue.code, issue.param) for issue in found]


@pytest.mark.parametrize("engine", ["llamacpp", "tensorrt_llm", "transformers"])
@pytest.mark.parametrize(("endpoint", "name", "value"), CASES, ids=[f"{e}:{n}={v!r}" for e, n, v in CASES])
def test_a_parameter_at_its_neutral_value_is_accepted_on_every_engine(
        engine: EngineName, endpoint: str, name: str, value: object) -> None:
    if endpoint == EMBEDDINGS and engine != "llamacpp":
        pytest.skip("only llama.cpp serves embeddings")
    assert issues(model_on(engine, endpoint), endpoint, **{name: value}) == []


def test_every_neutral_value_in_the_table_is_accepted_wherever_its_parameter_exists() -> None:
    for endpoint in PROMPTS:
        model = model_on("transformers" if endpoint != EMBEDDINGS else "llamacpp", endpoint)
        for name, values in NEUTRAL_VALUES.items():
            if name in known_parameters(endpoint):
                for value in values:
                    assert issues(model, endpoint, **{name: value}) == [], (endpoint, name, value)


def test_an_empty_suffix_and_a_repetition_penalty_of_one_run_on_smollm2() -> None:
    """The two refusals the issue names: `suffix: ""` was suffix_unavailable, `repetition_penalty: 1`
    unsupported_parameter."""
    model = model_on("llamacpp", COMPLETIONS)
    assert issues(model, COMPLETIONS, suffix="") == []
    assert issues(model, COMPLETIONS, repetition_penalty=1) == []
    assert issues(model, CHAT, repetition_penalty=1, presence_penalty=0, n=1, logprobs=False) == []


@pytest.mark.parametrize(("endpoint", "body", "expected"), [
    (COMPLETIONS, {"suffix": "The end."}, ("suffix_unavailable", "body.suffix")),
    (COMPLETIONS, {"echo": True}, ("echo_unavailable", "body.echo")),
    (COMPLETIONS, {"best_of": 2}, ("best_of_unavailable", "body.best_of")),
    (CHAT, {"repetition_penalty": 1.2}, ("repetition_penalty_unavailable", "body.repetition_penalty")),
    (CHAT, {"modalities": ["text", "audio"]}, ("modalities_unavailable", "body.modalities")),
    (CHAT, {"reasoning_effort": "high"}, ("reasoning_effort_unavailable", "body.reasoning_effort")),
    (CHAT, {"service_tier_typo": "auto"}, ("unsupported_parameter", "body.service_tier_typo")),
    (CHAT, {"repeat_penalty_x": 1}, ("unsupported_parameter", "body.repeat_penalty_x")),
], ids=lambda case: str(case))
def test_a_value_that_asks_something_of_the_engine_is_still_refused(
        endpoint: str, body: dict[str, object], expected: tuple[str, str]) -> None:
    assert issues(model_on("llamacpp", endpoint), endpoint, **body) == [expected]


def test_a_boolean_is_not_taken_for_a_neutral_number_nor_a_number_for_false() -> None:
    model = model_on("transformers", COMPLETIONS)
    assert issues(model, COMPLETIONS, echo=0) == [("echo_unavailable", "body.echo")]
    assert issues(model, COMPLETIONS, best_of=True) == [("best_of_unavailable", "body.best_of")]


def test_a_responses_line_may_include_its_log_probabilities_where_the_engine_states_them() -> None:
    llamacpp, transformers = model_on("llamacpp", RESPONSES), model_on("transformers", RESPONSES)
    asked = ["message.output_text.logprobs"]
    assert issues(llamacpp, RESPONSES, include=asked, top_logprobs=3) == []
    assert issues(transformers, RESPONSES, include=asked) == [("include_unavailable", "body.include")]
    assert issues(llamacpp, RESPONSES, include=["message.output_text.logprob"]) == [("invalid_body", "body.include")]
    assert issues(llamacpp, RESPONSES, include="message.output_text.logprobs") == [("invalid_body", "body.include")]
