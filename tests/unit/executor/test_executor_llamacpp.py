"""The llama.cpp engine with the real xllamacpp runtime and the real SmolLM2 GGUF, kept tiny."""

import asyncio
from collections.abc import Iterator

import pytest

from contracts.api.request_line import MAX_NESTING_DEPTH
from services.executor.adapters.engines.base import EngineReply, on_slot
from services.executor.adapters.engines.llamacpp import PROMPT_CACHE_RAM_MIB, LlamaCppEngine
from services.executor.adapters.engines.reply_shape import openai_shaped
from services.executor.retry import LineRetry, run_line
from services.executor.samples import run_samples
from services.runtime.storage.catalogue import load_catalogue
from services.validator.adapters.tokenizer import TokenizerCache
from tests.support import engine_threads

MODEL_ID = "smollm2-135m-instruct-q4_1"
SLOT_CONTEXT = 256


@pytest.fixture(scope="module")
def engine() -> Iterator[LlamaCppEngine]:
    model = load_catalogue(None).resolve(MODEL_ID)
    assert model is not None
    engine = LlamaCppEngine(n_threads=int(engine_threads()))
    engine.load(model.model_copy(update={"slots": 2, "context_length": SLOT_CONTEXT}))
    yield engine
    engine.unload()


def chat(content: str) -> dict[str, object]:
    return {"model": "smollm2", "messages": [{"role": "user", "content": content}], "max_tokens": 8, "seed": 1}


async def test_a_chat_line_returns_a_completion_with_usage_under_the_catalogue_id(
    engine: LlamaCppEngine,
) -> None:
    reply = await engine.run("/v1/chat/completions", chat("Say hi."))
    assert reply.status_code == 200
    assert reply.body["object"] == "chat.completion"
    assert reply.body["model"] == MODEL_ID
    usage = reply.body["usage"]
    assert isinstance(usage, dict) and usage["completion_tokens"] > 0 and usage["prompt_tokens"] > 0
    assert "timings" not in reply.body


async def test_a_completions_line_is_served_too(engine: LlamaCppEngine) -> None:
    reply = await engine.run("/v1/completions", {"prompt": "Once upon", "max_tokens": 4})
    assert reply.status_code == 200 and reply.body["object"] == "text_completion"


async def test_a_prompt_longer_than_the_slot_context_is_a_400_reply_not_an_exception(
    engine: LlamaCppEngine,
) -> None:
    reply = await engine.run("/v1/chat/completions", chat("word " * (SLOT_CONTEXT * 2)))
    assert reply.status_code == 400
    error = reply.body["error"]
    assert isinstance(error, dict)
    assert error["type"] == "invalid_request_error" and error["code"] == "exceed_context_size_error"


async def test_a_malformed_request_is_a_400_reply(engine: LlamaCppEngine) -> None:
    reply = await engine.run("/v1/chat/completions", {"messages": "not a list", "max_tokens": 2})
    assert reply.status_code == 400


async def test_an_endpoint_the_engine_does_not_serve_is_refused_per_line(engine: LlamaCppEngine) -> None:
    reply = await engine.run("/v1/embeddings", {"input": "x"})
    assert reply.status_code == 400


def schema(levels: int) -> dict[str, object]:
    nested: dict[str, object] = {"type": "string"}
    for _ in range(levels):
        nested = {"type": "object", "properties": {"a": nested}}
    return nested


def json_schema(levels: int) -> dict[str, object]:
    return {**chat("Say hi."), "response_format": {"type": "json_schema",
                                                    "json_schema": {"name": "s", "schema": schema(levels)}}}


REFUSED_AT_RUN_TIME = {
    # llama.cpp raises RuntimeError: no mmproj is loaded.
    "image part": {**chat("?"), "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": "data:,"}}]}]},
    # llama.cpp raises RuntimeError while parsing the tools.
    "tool named 5": {**chat("Hi."), "tools": [{"function": {"name": 5}}]},
    # xllamacpp's orjson.dumps raises TypeError past 254 levels.
    "900-deep json_schema": json_schema(450),
}


@pytest.mark.parametrize("body", REFUSED_AT_RUN_TIME.values(), ids=REFUSED_AT_RUN_TIME.keys())
async def test_a_request_llama_cpp_raises_on_is_a_400_reply_for_that_line(
        engine: LlamaCppEngine, body: dict[str, object]) -> None:
    reply = await engine.run("/v1/chat/completions", body)
    assert reply.status_code == 400
    error = reply.body["error"]
    assert isinstance(error, dict) and error["type"] == "invalid_request_error" and error["message"]


async def test_a_json_schema_as_deep_as_validation_allows_is_served(engine: LlamaCppEngine) -> None:
    # The line, body, response_format, json_schema and schema take 5 levels; each schema level 2 more.
    levels = (MAX_NESTING_DEPTH - 5) // 2
    reply = await engine.run("/v1/chat/completions", json_schema(levels))
    assert reply.status_code == 200


NEUTRAL_LINES = {
    "chat": ("/v1/chat/completions", {
        **chat("Hi."), "n": 1, "logprobs": False, "top_logprobs": 0, "presence_penalty": 0, "frequency_penalty": 0,
        "repetition_penalty": 1, "min_p": 0, "top_k": -1, "stream": False, "parallel_tool_calls": True,
        "service_tier": "auto", "store": False, "modalities": ["text"], "logit_bias": {}, "stop": [],
        "response_format": {"type": "text"}, "tools": [], "tool_choice": "none", "functions": [],
        "function_call": "none", "verbosity": "medium", "reasoning_effort": "none", "chat_template_kwargs": {}}),
    "chat auto": ("/v1/chat/completions", {**chat("Hi."), "tool_choice": "auto"}),
    "completions": ("/v1/completions", {
        "prompt": "Once upon", "max_tokens": 4, "suffix": "", "echo": False, "best_of": 1, "n": 1,
        "presence_penalty": 0, "repetition_penalty": 1, "top_k": 0, "min_p": 0, "logit_bias": {}}),
    "responses": ("/v1/responses", {
        "input": "Hi.", "max_output_tokens": 4, "tools": [], "tool_choice": "auto", "top_logprobs": 0,
        "truncation": "disabled", "reasoning": {}, "text": {"format": {"type": "text"}}, "include": []}),
}


@pytest.mark.parametrize(("endpoint", "body"), NEUTRAL_LINES.values(), ids=NEUTRAL_LINES.keys())
async def test_a_line_of_neutral_values_the_validator_accepts_runs_on_the_engine(
        engine: LlamaCppEngine, endpoint: str, body: dict[str, object]) -> None:
    reply = await engine.run(endpoint, body)
    assert reply.status_code == 200, reply.body


@pytest.mark.parametrize("asked", [{"top_logprobs": 2},
                                   {"include": ["message.output_text.logprobs"], "top_logprobs": 2}])
async def test_a_responses_line_asking_for_log_probabilities_gets_them_for_each_output_token(
        engine: LlamaCppEngine, asked: dict[str, object]) -> None:
    reply = await engine.run("/v1/responses", {"input": "Say hi.", "max_output_tokens": 3, "seed": 1, **asked})

    assert reply.status_code == 200, reply.body
    usage, output = reply.body["usage"], reply.body["output"]
    assert isinstance(usage, dict) and isinstance(output, list)
    logprobs = output[0]["content"][0]["logprobs"]
    assert len(logprobs) == usage["output_tokens"] and all(len(each["top_logprobs"]) == 2 for each in logprobs)
    assert "".join(each["token"] for each in logprobs) == output[0]["content"][0]["text"]


def test_the_engine_declares_what_it_honours(engine: LlamaCppEngine) -> None:
    assert {"max_tokens", "temperature", "seed"} <= engine.capabilities()
    assert engine.slots == 2 and engine.version


def test_the_prompt_cache_is_bounded_so_an_executor_does_not_grow_with_every_distinct_line(
    engine: LlamaCppEngine,
) -> None:
    model = load_catalogue(None).resolve(MODEL_ID)
    assert model is not None
    assert engine.params_for(model).cache_ram_mib == PROMPT_CACHE_RAM_MIB <= 256


RULES = " ".join(f"Rule {n}: answer in one word." for n in range(20))
"""A system prompt of about 170 tokens, shared by the lines below."""


def ruled(question: str) -> dict[str, object]:
    return {"model": "smollm2", "max_tokens": 2, "seed": 1,
            "messages": [{"role": "system", "content": RULES}, {"role": "user", "content": question}]}


def cached_tokens(body: dict[str, object]) -> int:
    usage = body["usage"]
    assert isinstance(usage, dict)
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details")
    assert isinstance(details, dict) and isinstance(details["cached_tokens"], int)
    return details["cached_tokens"]


async def test_a_line_after_one_sharing_its_system_prompt_on_the_same_slot_reports_the_prefix_as_cached(
    engine: LlamaCppEngine,
) -> None:
    with on_slot(1):
        first = await engine.run("/v1/chat/completions", ruled("Name a colour."))
        second = await engine.run("/v1/chat/completions", ruled("Name a fruit."))
    assert first.ok and second.ok
    usage = second.body["usage"]
    assert isinstance(usage, dict) and isinstance(usage["prompt_tokens"], int)
    # llama.cpp reports it: every token of the shared system prompt, not the question after it.
    assert usage["prompt_tokens"] - 15 <= cached_tokens(second.body) < usage["prompt_tokens"]
    assert cached_tokens(second.body) > cached_tokens(first.body)


async def test_the_same_prefix_on_another_slot_is_computed_again_so_the_slot_a_line_runs_on_matters(
    engine: LlamaCppEngine,
) -> None:
    with on_slot(1):
        await engine.run("/v1/chat/completions", ruled("Name a tree."))
    with on_slot(0):
        elsewhere = await engine.run("/v1/chat/completions", ruled("Name a bird."))
    assert elsewhere.ok and cached_tokens(elsewhere.body) < 30


async def test_completions_and_responses_report_cached_tokens_in_their_own_shapes(engine: LlamaCppEngine) -> None:
    with on_slot(0):
        for question in ("A", "B"):
            completion = await engine.run("/v1/completions", {"prompt": RULES + question, "max_tokens": 1})
    assert completion.body["object"] == "text_completion" and cached_tokens(completion.body) > 100
    with on_slot(1):
        for question in ("Name a colour.", "Name a fruit."):
            response = await engine.run("/v1/responses", {"instructions": RULES, "input": question,
                                                          "max_output_tokens": 2})
    assert response.body["object"] == "response" and cached_tokens(response.body) > 100


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": "Say hi."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three rivers, ünïcode too."}],
    [{"role": "user", "content": "<|im_start|> is special; so is <|endoftext|>."}],
])
async def test_the_validator_counts_a_chat_prompt_as_the_engine_does(
        engine: LlamaCppEngine, messages: list[dict[str, object]]) -> None:
    model = load_catalogue(None).resolve(MODEL_ID)
    assert model is not None
    tokenizer = TokenizerCache().get(model)
    assert tokenizer is not None
    reply = await engine.run("/v1/chat/completions", {"messages": messages, "max_tokens": 1, "seed": 1})
    usage = reply.body["usage"]
    assert isinstance(usage, dict) and tokenizer.count_chat(messages) == usage["prompt_tokens"]


async def test_a_lines_n_samples_come_back_as_its_choices_the_same_on_every_run(engine: LlamaCppEngine) -> None:
    body = {**chat("Name a colour."), "n": 3, "seed": 11, "temperature": 1.0, "max_tokens": 6}

    async def sampled() -> EngineReply:
        return await run_samples("/v1/chat/completions", body,
                                 lambda sample: run_line(engine, "/v1/chat/completions", sample, LineRetry()))

    first, again = await sampled(), await sampled()
    assert first.ok and again.ok
    choices = first.body["choices"]
    assert isinstance(choices, list) and [c["index"] for c in choices] == [0, 1, 2]
    texts = [c["message"]["content"] for c in choices]
    assert texts == [c["message"]["content"] for c in again.body["choices"]]  # type: ignore[attr-defined]
    assert len(set(texts)) > 1, "each sample draws with its own seed"
    single = await engine.run("/v1/chat/completions", {**body, "n": 1})
    assert single.body["choices"][0]["message"]["content"] == texts[0]  # type: ignore[index]
    usage, one = first.body["usage"], single.body["usage"]
    assert isinstance(usage, dict) and isinstance(one, dict)
    assert usage["prompt_tokens"] == one["prompt_tokens"]  # the prompt counts once
    assert 3 <= usage["completion_tokens"] <= 3 * 6  # every sample's tokens
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


async def test_template_kwargs_and_token_id_prompts_reach_the_engine(engine: LlamaCppEngine) -> None:
    thinking_off = await engine.run("/v1/chat/completions",
                                    {**chat("Say hi."), "chat_template_kwargs": {"enable_thinking": False}})
    assert thinking_off.ok
    ids = await engine.run("/v1/completions", {"prompt": [504, 3458, 282], "max_tokens": 3})
    assert ids.ok and ids.body["usage"]["prompt_tokens"] == 3  # type: ignore[index]


UNSTREAMED_ALIKE = {
    "chat": ("/v1/chat/completions", {**chat("Say hello in three words."), "max_tokens": 12}),
    "chat ending on its own": ("/v1/chat/completions", {**chat("Say hi."), "max_tokens": 40}),
    "chat with logprobs, ending on its own": ("/v1/chat/completions", {
        **chat("Say hi."), "max_tokens": 40, "logprobs": True, "top_logprobs": 2}),
    "chat with logprobs cut by a stop": ("/v1/chat/completions", {
        **chat("Count: 1, 2, 3,"), "max_tokens": 16, "stop": [","], "logprobs": True, "top_logprobs": 1}),
    "chat cut by a stop": ("/v1/chat/completions", {**chat("Count: 1, 2, 3,"), "max_tokens": 16, "stop": [","]}),
    "chat in json mode": ("/v1/chat/completions", {**chat("Give a JSON object."), "response_format": {
        "type": "json_object"}}),
    "completion": ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 8, "seed": 1}),
    "completion with logprobs": ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 4, "logprobs": 2}),
    "completion cut by a stop": ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 8, "stop": [","]}),
    "completion with logprobs cut by a stop": ("/v1/completions", {
        "prompt": "Once upon a time", "max_tokens": 8, "stop": [","], "logprobs": 1}),
}


def without_run_facts(body: dict[str, object]) -> dict[str, object]:
    """A reply without what differs from run to run: its id, its time, and how much of the prompt was cached."""
    usage = dict(body["usage"])  # type: ignore[call-overload]
    usage.pop("prompt_tokens_details", None)
    return {**{key: value for key, value in body.items() if key not in ("id", "created", "timings")}, "usage": usage}


@pytest.mark.parametrize(("endpoint", "body"), UNSTREAMED_ALIKE.values(), ids=UNSTREAMED_ALIKE.keys())
async def test_a_line_runs_streamed_where_it_can_stop_yet_its_reply_is_llama_cpps_unstreamed_answer(
        engine: LlamaCppEngine, endpoint: str, body: dict[str, object]) -> None:
    body = {**body, "temperature": 0}
    server = engine._server
    assert server is not None
    call = server.handle_chat_completions if endpoint == "/v1/chat/completions" else server.handle_completions
    with on_slot(0):
        reply = await engine.run(endpoint, body)
    unstreamed = engine._reply(MODEL_ID, call({**body, "id_slot": 0}))
    assert reply.status_code == unstreamed.status_code == 200
    shaped = openai_shaped(endpoint, unstreamed.body)  # both in OpenAI's shape (fields it requires filled)
    assert list(reply.body) == list(shaped)  # the same fields, in llama.cpp's order
    assert without_run_facts(reply.body) == without_run_facts(shaped)


@pytest.mark.parametrize("asked", [{}, {"logprobs": 1}], ids=["streamed", "with logprobs, unstreamed"])
async def test_a_completions_line_of_several_prompts_states_the_usage_of_them_all(
        engine: LlamaCppEngine, asked: dict[str, object]) -> None:
    body = {"max_tokens": 3, "temperature": 0, **asked}
    both = await engine.run("/v1/completions", {"prompt": ["Once upon a time", "The sky is"], **body})
    first = await engine.run("/v1/completions", {"prompt": "Once upon a time", **body})
    second = await engine.run("/v1/completions", {"prompt": "The sky is", **body})
    choices = both.body["choices"]
    assert isinstance(choices, list) and [choice["index"] for choice in choices] == [0, 1]
    assert [choice["text"] for choice in choices] == [one.body["choices"][0]["text"]  # type: ignore[index]
                                                      for one in (first, second)]
    assert [choice["logprobs"] is None for choice in choices] == ["logprobs" not in asked] * 2
    usage = both.body["usage"]
    assert isinstance(usage, dict)
    for count in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert usage[count] == first.body["usage"][count] + second.body["usage"][count]  # type: ignore[index]


def decodes(engine: LlamaCppEngine) -> int:
    """llama.cpp's count of decode steps so far (every prompt batch and every generated token of every slot)."""
    assert engine._server is not None
    metrics = str(engine._server.handle_metrics())
    return int(float(next(line.split()[-1] for line in metrics.splitlines()
                          if line.startswith("llamacpp:n_decode_total"))))


@pytest.fixture(scope="module")
def one_slot_engine() -> Iterator[LlamaCppEngine]:
    model = load_catalogue(None).resolve(MODEL_ID)
    assert model is not None
    engine = LlamaCppEngine(n_threads=int(engine_threads()))
    engine.load(model.model_copy(update={"slots": 1, "context_length": 2048}))
    yield engine
    engine.unload()


async def test_a_cancelled_line_stops_in_the_engine_and_frees_its_slot_for_the_next(
        one_slot_engine: LlamaCppEngine) -> None:
    engine = one_slot_engine
    before = decodes(engine)
    long = asyncio.create_task(engine.run("/v1/chat/completions", {
        **chat("Tell a long story."), "max_tokens": 1500, "ignore_eos": True}))
    for _ in range(12_000):  # until it generates (a loaded machine may take long to even start)
        if decodes(engine) > before + 2 or long.done():
            break
        await asyncio.sleep(0.01)
    assert not long.done()
    long.cancel()
    with pytest.raises(asyncio.CancelledError):
        await long
    short = await engine.run("/v1/chat/completions", chat("Say hi."))  # the one slot: after the long line ends
    assert short.ok
    # Run to its end, the long line alone would take 1,500 steps before the short line could start.
    assert decodes(engine) - before < 750
