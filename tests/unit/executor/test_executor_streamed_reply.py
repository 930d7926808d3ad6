"""llama.cpp's chunks put back together as its unstreamed answer: the shapes the small real model never produces
(tool calls, reasoning, an error in the stream, a stream cut short)."""

from typing import Any

from services.executor.adapters.engines.streamed_reply import StreamedReply


def chunk(delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"choices": [{"finish_reason": finish_reason, "index": 0, "delta": delta}], "created": 7,
            "id": "chatcmpl-1", "model": "-", "system_fingerprint": "b1", "object": "chat.completion.chunk", **extra}


USAGE = {"completion_tokens": 9, "prompt_tokens": 20, "total_tokens": 29, "prompt_tokens_details": {"cached_tokens": 4}}


def folded(*chunks: object, chat: bool = True) -> dict[str, Any]:
    streamed = StreamedReply(chat=chat)
    for each in chunks:
        streamed.take(each)
    return streamed.reply()


def test_tool_calls_are_assembled_from_their_deltas_with_whole_ids_and_names_and_growing_arguments() -> None:
    reply = folded(
        chunk({"role": "assistant", "content": None}),
        chunk({"reasoning_content": "The user wants "}), chunk({"reasoning_content": "weather."}),
        chunk({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                               "function": {"name": "get_weather", "arguments": "{\"ci"}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": "ty\": \"Paris\"}"}}]}),
        chunk({"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                               "function": {"name": "get_time", "arguments": "{}"}}]}),
        chunk({}, "tool_calls"),
        {**chunk({}), "choices": [], "usage": USAGE, "timings": {"cache_n": 4}},
    )
    assert reply["choices"] == [{"finish_reason": "tool_calls", "index": 0, "message": {
        "role": "assistant", "content": "", "reasoning_content": "The user wants weather.", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
             "id": "call_a"},
            {"type": "function", "function": {"name": "get_time", "arguments": "{}"}, "id": "call_b"}]}}]
    assert reply["object"] == "chat.completion" and reply["usage"] == USAGE and reply["id"] == "chatcmpl-1"
    assert reply["timings"] == {"cache_n": 4}


def test_an_error_in_the_stream_is_the_reply() -> None:
    error = {"error": {"code": 400, "message": "the request exceeds the context", "type": "exceed_context_size_error"}}
    assert folded(chunk({"content": "Hel"}), error) == error


def test_a_stream_that_ends_before_its_finish_and_usage_is_a_server_error_not_a_short_answer() -> None:
    cut = folded(chunk({"role": "assistant", "content": None}), chunk({"content": "Hel"}))
    assert cut["type"] == "server_error"
    no_usage = folded(chunk({"content": "Hello"}, "stop"))
    assert no_usage["type"] == "server_error"
    assert folded(None)["type"] == "server_error"


def test_a_completions_stream_keeps_each_prompts_choice_and_adds_up_their_usage() -> None:
    def text(index: int, piece: str, finish_reason: str | None = None, **extra: Any) -> dict[str, Any]:
        return {"choices": [{"text": piece, "index": index, "logprobs": None, "finish_reason": finish_reason}],
                "created": 7, "model": "-", "system_fingerprint": "b1", "object": "text_completion", "id": "c", **extra}

    reply = folded(None, text(1, " blue"), text(0, ", a"), text(1, "", "length", usage=USAGE),
                   text(0, "", "stop", usage={**USAGE, "prompt_tokens_details": {"cached_tokens": 1}}), chat=False)
    assert reply["choices"] == [{"text": ", a", "index": 0, "logprobs": None, "finish_reason": "stop"},
                                {"text": " blue", "index": 1, "logprobs": None, "finish_reason": "length"}]
    assert reply["usage"] == {"completion_tokens": 18, "prompt_tokens": 40, "total_tokens": 58,
                              "prompt_tokens_details": {"cached_tokens": 5}}
