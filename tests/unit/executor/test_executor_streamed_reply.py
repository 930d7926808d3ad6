"""llama.cpp's chunks put back together as its unstreamed answer: the shapes the small real model never produces
(reasoning, an error in the stream, a stream cut short), and which requests stream at all."""

from typing import Any

import pytest

from contracts.api.request_line import completion_prompts
from services.executor.adapters.engines.llamacpp import LineCall
from services.executor.adapters.engines.streamed_reply import StreamedReply, one_answer, streamable


def chunk(delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"choices": [{"finish_reason": finish_reason, "index": 0, "delta": delta}], "created": 7,
            "id": "chatcmpl-1", "model": "-", "system_fingerprint": "b1", "object": "chat.completion.chunk", **extra}


USAGE = {"completion_tokens": 9, "prompt_tokens": 20, "total_tokens": 29, "prompt_tokens_details": {"cached_tokens": 4}}


def folded(*chunks: object, chat: bool = True, expected_choices: int = 1) -> dict[str, Any]:
    streamed = StreamedReply(chat=chat, expected_choices=expected_choices)
    for each in chunks:
        streamed.take(each)
    return streamed.reply()


def test_reasoning_and_content_are_assembled_from_their_deltas_in_llama_cpps_order() -> None:
    reply = folded(
        chunk({"role": "assistant", "content": None}),
        chunk({"reasoning_content": "The user wants "}), chunk({"reasoning_content": "a greeting."}),
        chunk({"content": "Hel"}), chunk({"content": "lo."}), chunk({}, "stop"),
        {**chunk({}), "choices": [], "usage": USAGE, "timings": {"cache_n": 4}},
    )
    assert reply["choices"] == [{"finish_reason": "stop", "index": 0, "message": {
        "role": "assistant", "reasoning_content": "The user wants a greeting.", "content": "Hello."}}]
    assert list(reply["choices"][0]["message"]) == ["role", "reasoning_content", "content"]
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


def text(index: int, piece: str, finish_reason: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"choices": [{"text": piece, "index": index, "logprobs": None, "finish_reason": finish_reason}],
            "created": 7, "model": "-", "system_fingerprint": "b1", "object": "text_completion", "id": "c", **extra}


def test_a_completions_stream_keeps_each_prompts_choice_and_adds_up_their_usage() -> None:
    reply = folded(None, text(1, " blue"), text(0, ", a"), text(1, "", "length", usage=USAGE),
                   text(0, "", "stop", usage={**USAGE, "prompt_tokens_details": {"cached_tokens": 1}}), chat=False,
                   expected_choices=2)
    assert reply["choices"] == [{"text": ", a", "index": 0, "logprobs": None, "finish_reason": "stop"},
                                {"text": " blue", "index": 1, "logprobs": None, "finish_reason": "length"}]
    assert reply["usage"] == {"completion_tokens": 18, "prompt_tokens": 40, "total_tokens": 58,
                              "prompt_tokens_details": {"cached_tokens": 5}}


def test_a_stream_cut_after_one_of_two_prompts_finished_is_a_server_error() -> None:
    one = folded(text(0, ", a"), text(0, "", "stop", usage=USAGE), chat=False, expected_choices=2)
    assert one["type"] == "server_error"


@pytest.mark.parametrize(("request_body", "streams"), [
    ({"messages": [], "max_tokens": 4}, True),
    ({"messages": [], "logprobs": False, "top_logprobs": 0, "tools": []}, True),
    ({"messages": [], "logprobs": True}, False),
    ({"messages": [], "top_logprobs": 2}, False),
    ({"prompt": "a", "logprobs": 1}, False),
    ({"prompt": "a", "n_probs": 3}, False),
    ({"messages": [], "tools": [{"type": "function", "function": {"name": "f"}}]}, False),
])
def test_only_requests_whose_answer_a_stream_rebuilds_are_streamed(request_body: dict[str, Any],
                                                                   streams: bool) -> None:
    assert streamable(request_body) is streams


def test_a_completions_request_answers_once_per_prompt() -> None:
    assert [completion_prompts(p) for p in ("a", ["a", "b"], [1, 2, 3], [[1, 2], [3]], [])] == [1, 2, 1, 2, 1]


def test_the_answers_to_a_lines_prompts_asked_one_by_one_are_one_answer_or_its_first_error() -> None:
    def answer(piece: str, completion_tokens: int) -> dict[str, Any]:
        return {"choices": [{"text": piece, "index": 0, "logprobs": {"content": []}, "finish_reason": "length"}],
                "object": "text_completion", "id": "c", "usage": {**USAGE, "completion_tokens": completion_tokens}}

    merged = one_answer([answer(", a", 2), answer(" blue", 3)])
    assert [(c["index"], c["text"]) for c in merged["choices"]] == [(0, ", a"), (1, " blue")]
    assert merged["usage"]["completion_tokens"] == 5 and merged["usage"]["prompt_tokens"] == 40
    error = {"error": {"code": 400, "message": "too long", "type": "exceed_context_size_error"}}
    assert one_answer([answer(", a", 2), error]) == error


def test_a_cancelled_unstreamed_line_of_several_prompts_runs_no_further_prompt() -> None:
    asked: list[object] = []

    def call(request: dict[str, Any]) -> dict[str, Any]:
        asked.append(request["prompt"])
        line.stop.set()  # its task is cancelled while the first prompt runs
        return {"choices": [{"text": "x", "index": 0, "logprobs": None, "finish_reason": "length"}], "usage": USAGE}

    line = LineCall(call, {"prompt": ["a", "b", "c"], "logprobs": 1, "max_tokens": 2}, "/v1/completions")
    assert line.answer()["type"] == "server_error"  # dropped anyway: nobody waits for a cancelled line
    assert asked == ["a"]
