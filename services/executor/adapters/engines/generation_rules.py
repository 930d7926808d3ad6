"""What a line asks of generation, read from its body as OpenAI does, for the engines that sample here
(transformers): how it samples, how many tokens it may make, where a stop cuts it, which row tokens are its own."""

from dataclasses import dataclass
from typing import Any

COMPLETIONS_DEFAULT_MAX_TOKENS = 16
"""OpenAI's `/v1/completions` default; chat and responses run to the context, as OpenAI's and trtllm-serve's do."""


@dataclass(frozen=True)
class Sampling:
    """How a line samples; lines sampling alike share a batch."""

    greedy: bool
    temperature: float
    top_p: float
    top_k: int
    repetition_penalty: float
    seed: int | None


def sampling_of(body: dict[str, Any]) -> Sampling:
    temperature = float(body["temperature"]) if body.get("temperature") is not None else 1.0
    top_p = float(body["top_p"]) if body.get("top_p") is not None else 1.0
    top_k = int(body["top_k"]) if body.get("top_k") is not None else 0
    penalty = float(body["repetition_penalty"]) if body.get("repetition_penalty") is not None else 1.0
    seed = int(body["seed"]) if body.get("seed") is not None else None
    greedy = temperature == 0 or top_k == 1
    return Sampling(greedy, temperature, top_p, top_k, penalty, seed)


def max_new_tokens(body: dict[str, Any], endpoint: str, prompt_tokens: int, context: int) -> int:
    """The line's own limit, or OpenAI's default: completions 16, chat and responses the rest of the context."""
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is None:
        return COMPLETIONS_DEFAULT_MAX_TOKENS if endpoint == "/v1/completions" else context - prompt_tokens
    return int(limit)


def cut_at_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    """The text up to the first stop string (excluded), and whether one was found."""
    found = [index for index in (text.find(stop) for stop in stops if stop) if index >= 0]
    return (text[:min(found)], True) if found else (text, False)


class PromptTooLong(ValueError):
    """A prompt that leaves no room in the model's context for a token of output."""


def token_list(value: object) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list | tuple) else [int(value)]  # type: ignore[call-overload]


def own_tokens(tokens: list[int], limit: int, eos: set[int], ignore_eos: bool) -> tuple[list[int], bool]:
    """A row's own tokens: up to its first EOS (excluded; padding may follow), within its limit; whether it ended."""
    mine = tokens[:limit]
    if not ignore_eos:
        for index, token in enumerate(mine):
            if token in eos:
                return mine[:index], True
    return mine, False
