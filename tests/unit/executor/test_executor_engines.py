"""Engine-side mappings without any runtime: Responses over chat, TensorRT-LLM's sampling parameters,
line retries, and the capabilities every engine declares from the one shared table."""


import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from contracts.catalogue import CatalogueModel
from contracts.engines import honoured_parameters
from services.executor.adapters.engines.base import Engine, EngineReply, EngineUnavailable, error_reply
from services.executor.adapters.engines.reply_shape import openai_shaped
from services.executor.adapters.engines.responses import UnmappableRequest, chat_request, response_body
from services.executor.adapters.engines.tensorrt_llm import TensorRtLlmEngine, sampling_kwargs
from services.executor.retry import LineRetry, run_line

MODEL = CatalogueModel(id="m", engine="tensorrt_llm", artifact="/nowhere", context_length=256,
                       memory_bytes=1, endpoints=["/v1/chat/completions"])


def test_a_responses_request_becomes_chat_messages_with_instructions_first() -> None:
    request = chat_request({"model": "m", "instructions": "Be brief.", "max_output_tokens": 8, "seed": 2,
                            "input": [{"role": "developer", "content": "Rules."},
                                      {"type": "message", "role": "user",
                                       "content": [{"type": "input_text", "text": "Hi "},
                                                   {"type": "input_text", "text": "there"}]}]})
    assert request == {"messages": [{"role": "system", "content": "Be brief."},
                                    {"role": "system", "content": "Rules."},
                                    {"role": "user", "content": "Hi there"}],
                       "max_tokens": 8, "seed": 2}


def test_a_string_input_is_one_user_message_and_json_mode_carries_over() -> None:
    request = chat_request({"input": "Hello", "text": {"format": {"type": "json_object"}}})
    assert request["messages"] == [{"role": "user", "content": "Hello"}]
    assert request["response_format"] == {"type": "json_object"}


def test_a_non_text_input_cannot_be_mapped() -> None:
    with pytest.raises(UnmappableRequest):
        chat_request({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]})


def test_a_chat_completion_becomes_a_response_object_with_input_and_output_tokens() -> None:
    completion = {"id": "chatcmpl-1", "created": 7, "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Hi!"}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}
    body = response_body(completion, "m")
    assert body["object"] == "response" and body["status"] == "completed" and body["model"] == "m"
    assert body["id"].startswith("resp_") and body["created_at"] == 7
    assert body["output"][0]["content"] == [{"type": "output_text", "text": "Hi!", "annotations": [], "logprobs": []}]
    assert body["usage"]["input_tokens"] == 5 and body["usage"]["output_tokens"] == 2
    assert body["usage"]["total_tokens"] == 7


def test_a_response_body_validates_as_the_sdks_response_and_states_the_lines_settings() -> None:
    completion = {"id": "chatcmpl-1", "created": 7, "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Hi!"}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}
    line = {"model": "m", "input": "Hello", "instructions": "Be brief.", "temperature": 0.2,
            "max_output_tokens": 9, "metadata": {"run": "1"}}

    body = response_body(completion, "m", line)

    parsed = Response.model_validate(body)
    assert parsed.output_text == "Hi!" and parsed.instructions == "Be brief." and parsed.temperature == 0.2
    assert parsed.max_output_tokens == 9 and parsed.metadata == {"run": "1"} and parsed.tools == []
    assert body["error"] is None and body["top_p"] == 1.0


def test_chat_and_text_completions_come_in_openais_exact_shape() -> None:
    message: dict[str, object] = {"role": "assistant", "content": "Hi!"}
    chat = {"id": "chatcmpl-1", "object": "chat.completion", "created": 7, "model": "m", "choices": [
        {"index": 0, "finish_reason": "stop", "message": message}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}
    text = {**chat, "object": "text_completion", "choices": [{"index": 0, "finish_reason": "stop", "text": "Hi!"}]}

    shaped_chat, shaped_text = openai_shaped("/v1/chat/completions", chat), openai_shaped("/v1/completions", text)

    assert shaped_chat["choices"][0]["logprobs"] is None and shaped_chat["choices"][0]["message"]["refusal"] is None
    assert shaped_chat["id"] == "chatcmpl-1" and ChatCompletion.model_validate(shaped_chat).choices[0].message.content
    assert shaped_text["id"] == "cmpl-1" and Completion.model_validate(shaped_text).choices[0].text == "Hi!"
    assert "refusal" not in message, "the engine's own reply is not changed"


def test_a_responses_request_for_log_probabilities_asks_chat_for_them_as_chat_spells_it() -> None:
    by_count = chat_request({"input": "Hi", "top_logprobs": 2})
    by_include = chat_request({"input": "Hi", "include": ["message.output_text.logprobs"]})
    neither = chat_request({"input": "Hi", "top_logprobs": 0, "include": []})

    assert (by_count["logprobs"], by_count["top_logprobs"]) == (True, 2)  # llama.cpp refuses top_logprobs alone
    assert (by_include["logprobs"], by_include["top_logprobs"]) == (True, 0)
    assert "logprobs" not in neither and "top_logprobs" not in neither


def test_a_chat_choices_log_probabilities_become_the_output_texts() -> None:
    hello = {"id": 19556, "token": "Hello", "bytes": [72, 101, 108, 108, 111], "logprob": -1.2}
    welcome = {"id": 9085, "token": "Welcome", "bytes": [87, 101], "logprob": -2.7}
    completion = {"id": "chatcmpl-1", "created": 7, "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Hello"},
         "logprobs": {"content": [{**hello, "top_logprobs": [hello, welcome]}]}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}

    body = response_body(completion, "m", {"input": "Hi", "top_logprobs": 2})

    logprobs = Response.model_validate(body).output[0].content[0].logprobs  # type: ignore[union-attr,index]
    assert logprobs is not None
    assert [(each.token, each.logprob, each.bytes) for each in logprobs] == [("Hello", -1.2, hello["bytes"])]
    assert [(top.token, top.logprob) for top in logprobs[0].top_logprobs] == [("Hello", -1.2), ("Welcome", -2.7)]
    assert body["top_logprobs"] == 2


def test_a_response_cut_at_max_output_tokens_is_incomplete() -> None:
    completion = {"choices": [{"finish_reason": "length", "message": {"content": "Hi"}}], "usage": {}}
    body = response_body(completion, "m")
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}


def test_openai_parameters_map_onto_tensorrt_llm_sampling_params() -> None:
    kwargs = sampling_kwargs({
        "model": "m", "messages": [], "max_tokens": 12, "temperature": 0.5, "top_p": 0.9, "top_k": 40,
        "seed": 3, "stop": "END", "n": 2, "ignore_eos": True, "user": "u",
    })
    assert kwargs == {"max_tokens": 12, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "seed": 3,
                      "stop": ["END"], "n": 2, "ignore_eos": True, "add_special_tokens": False}


def test_max_completion_tokens_wins_and_only_completions_default_to_16() -> None:
    assert sampling_kwargs({"max_completion_tokens": 5, "max_tokens": 9})["max_tokens"] == 5
    assert sampling_kwargs({})["max_tokens"] is None
    assert sampling_kwargs({}, "/v1/completions")["max_tokens"] == 16
    assert sampling_kwargs({"logprobs": True, "top_logprobs": 3})["logprobs"] == 3
    assert sampling_kwargs({"logprobs": True})["logprobs"] == 0


def test_tensorrt_llm_says_clearly_that_it_cannot_load_where_it_is_absent() -> None:
    engine = TensorRtLlmEngine()
    with pytest.raises(EngineUnavailable, match="TensorRT-LLM is not installed"):
        engine.load(MODEL)
    assert engine.version == "not-installed" and engine.slots == 0


def test_each_engine_declares_what_the_shared_table_says_it_honours() -> None:
    from services.executor.adapters.engines.llamacpp import LlamaCppEngine

    assert LlamaCppEngine(n_threads=1).capabilities() == honoured_parameters("llamacpp")
    assert TensorRtLlmEngine().capabilities() == honoured_parameters("tensorrt_llm")


class ScriptedEngine(Engine):
    """Replies from a script, one per call."""

    name = "llamacpp"

    def __init__(self, replies: list[EngineReply]) -> None:
        self.replies = replies
        self.calls = 0

    version = "test"
    slots = 1

    def capabilities(self) -> frozenset[str]:
        return frozenset()

    def load(self, model: CatalogueModel) -> None: ...

    def unload(self) -> None: ...

    async def run(self, endpoint: str, body: dict[str, object]) -> EngineReply:
        self.calls += 1
        return self.replies.pop(0)


FAST = LineRetry(attempts=3, base_delay_s=0.001)


async def test_a_transient_engine_error_is_retried_until_the_line_succeeds() -> None:
    engine = ScriptedEngine([error_reply(503, "busy"), EngineReply(200, {"ok": True})])
    reply = await run_line(engine, "/v1/chat/completions", {}, FAST)
    assert reply == EngineReply(200, {"ok": True}) and engine.calls == 2


async def test_a_line_that_keeps_failing_transiently_ends_as_its_last_error_after_bounded_tries() -> None:
    engine = ScriptedEngine([error_reply(500, f"crash {n}") for n in range(5)])
    reply = await run_line(engine, "/v1/chat/completions", {}, FAST)
    assert reply.status_code == 500 and engine.calls == 3


async def test_a_4xx_reply_is_final_at_once() -> None:
    engine = ScriptedEngine([error_reply(400, "too long"), EngineReply(200, {})])
    reply = await run_line(engine, "/v1/chat/completions", {}, FAST)
    assert reply.status_code == 400 and engine.calls == 1


def test_backoff_doubles_between_tries() -> None:
    assert [LineRetry(base_delay_s=0.5).delay_s(n) for n in (1, 2, 3)] == [0.5, 1.0, 2.0]


class RaisingEngine(ScriptedEngine):
    """Raises on a line instead of replying, as an engine's port says it must not."""

    async def run(self, endpoint: str, body: dict[str, object]) -> EngineReply:
        self.calls += 1
        raise KeyError("messages")


async def test_an_engine_that_raises_on_a_line_fails_that_line_with_a_500_not_the_attempt() -> None:
    engine = RaisingEngine([])
    reply = await run_line(engine, "/v1/chat/completions", {}, FAST)
    assert reply.status_code == 500 and engine.calls == 3
    error = reply.body["error"]
    assert isinstance(error, dict) and error["code"] == "engine_error"


class UnavailableEngine(ScriptedEngine):
    async def run(self, endpoint: str, body: dict[str, object]) -> EngineReply:
        raise EngineUnavailable("crashed")


async def test_an_unavailable_engine_still_stops_the_attempt() -> None:
    with pytest.raises(EngineUnavailable):
        await run_line(UnavailableEngine([]), "/v1/chat/completions", {}, FAST)
