"""A line's `n` samples: one request per sample, seeds derived from the line's, choices merged in order."""

import pytest

from services.executor.adapters.engines.base import EngineReply, error_reply
from services.executor.samples import MAX_SEED, run_samples, sample_bodies, sample_seed

CHAT = "/v1/chat/completions"


def test_sample_zero_keeps_the_lines_seed_and_the_others_derive_theirs_the_same_way_every_time() -> None:
    seeds = [sample_seed(2**53 - 1, i) for i in range(64)]
    assert seeds[0] == 2**53 - 1 and seeds == [sample_seed(2**53 - 1, i) for i in range(64)]
    assert len(set(seeds)) == 64 and all(0 <= s <= MAX_SEED for s in seeds[1:])  # type: ignore[operator]
    assert sample_seed(None, 3) is None  # no seed: the engine draws


def test_a_line_asking_one_sample_is_sent_as_it_is_and_n_samples_as_n_single_requests() -> None:
    body: dict[str, object] = {"messages": [], "n": 1, "seed": 5}
    assert sample_bodies(CHAT, body) == [body]
    samples = sample_bodies(CHAT, {"messages": [], "n": 3, "seed": 5})
    assert [s.get("seed") for s in samples] == [5, sample_seed(5, 1), sample_seed(5, 2)]
    assert all("n" not in s for s in samples)
    assert sample_bodies("/v1/embeddings", {"input": "x", "n": 3}) == [{"input": "x", "n": 3}]


def reply(text: str, completion: int) -> EngineReply:
    return EngineReply(200, {"object": "chat.completion", "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": completion, "total_tokens": 10 + completion,
                  "prompt_tokens_details": {"cached_tokens": 0}}})


async def test_the_samples_choices_come_back_in_order_with_the_prompt_counted_once() -> None:
    answers = iter([reply("red", 2), reply("blue", 3), reply("green", 4)])
    sent: list[dict[str, object]] = []

    async def run_one(body: dict[str, object]) -> EngineReply:
        sent.append(body)
        return next(answers)

    merged = await run_samples(CHAT, {"messages": [], "n": 3, "seed": 1}, run_one)
    assert len(sent) == 3 and merged.ok
    assert [(c["index"], c["message"]["content"]) for c in merged.body["choices"]] == [  # type: ignore[attr-defined]
        (0, "red"), (1, "blue"), (2, "green")]
    assert merged.body["usage"] == {"prompt_tokens": 10, "completion_tokens": 9, "total_tokens": 19,
                                    "prompt_tokens_details": {"cached_tokens": 0}}


@pytest.mark.parametrize("failing", [0, 1])
async def test_a_failed_sample_fails_the_line_with_its_own_reply(failing: int) -> None:
    refused = error_reply(400, "too long", "context_too_long")
    answers = [reply("a", 1), reply("b", 1)]
    answers[failing] = refused
    sent = iter(answers)

    async def run_one(body: dict[str, object]) -> EngineReply:
        return next(sent)

    assert await run_samples(CHAT, {"messages": [], "n": 2}, run_one) == refused
