"""A line's `n` samples (chat and completions): `n` requests of one sample each, one after another on the line's slot
(its prompt stays cached), answered as one reply. Sample 0 uses the line's `seed` (the answer with `n` = 1), sample i a
seed derived from it and i, so every run gives the same samples. Usage counts the prompt once."""

import hashlib
from collections.abc import Awaitable, Callable
from typing import Any

from services.executor.adapters.engines.base import EngineReply

SAMPLED_ENDPOINTS = frozenset({"/v1/chat/completions", "/v1/completions"})
MAX_SEED = 0xFFFFFFFE
"""Derived seeds are 32-bit (llama.cpp's), short of 0xFFFFFFFF, which llama.cpp reads as "draw one at random"."""


def sample_seed(seed: int | None, index: int) -> int | None:
    if seed is None or index == 0:
        return seed
    digest = hashlib.sha256(f"sheshnag-sample:{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % (MAX_SEED + 1)


def sample_bodies(endpoint: str, body: dict[str, object]) -> list[dict[str, object]]:
    """The request of each sample (the body itself when the line asks for one)."""
    count = body.get("n")
    if endpoint not in SAMPLED_ENDPOINTS or not isinstance(count, int) or isinstance(count, bool) or count <= 1:
        return [body]
    seed = body.get("seed")
    line_seed = seed if isinstance(seed, int) and not isinstance(seed, bool) else None
    single = {key: value for key, value in body.items() if key not in ("n", "seed")}
    return [{**single, **({} if (s := sample_seed(line_seed, i)) is None else {"seed": s})} for i in range(count)]


def merged(replies: list[EngineReply]) -> EngineReply:
    """One reply for the line: the first failed sample's reply if one failed, else every sample's choice in order."""
    failed = next((reply for reply in replies if not reply.ok), None)
    if failed is not None or len(replies) == 1:
        return failed or replies[0]
    body: dict[str, Any] = dict(replies[0].body)
    choices: list[dict[str, Any]] = []
    completion = 0
    for reply in replies:
        given = reply.body.get("choices")
        for choice in given if isinstance(given, list) else []:
            choices.append({**choice, "index": len(choices)})
        usage = reply.body.get("usage")
        completion += int(usage.get("completion_tokens", 0)) if isinstance(usage, dict) else 0
    body["choices"] = choices
    usage = body.get("usage")
    if isinstance(usage, dict):
        prompt = int(usage.get("prompt_tokens", 0))
        body["usage"] = {**usage, "completion_tokens": completion, "total_tokens": prompt + completion}
    return EngineReply(replies[0].status_code, body)


async def run_samples(endpoint: str, body: dict[str, object],
                      run_one: Callable[[dict[str, object]], Awaitable[EngineReply]]) -> EngineReply:
    """Every sample of the line, one after another (a failed one ends it: the line fails as a whole)."""
    replies: list[EngineReply] = []
    for sample in sample_bodies(endpoint, body):
        replies.append(await run_one(sample))
        if not replies[-1].ok:
            break
    return merged(replies)
