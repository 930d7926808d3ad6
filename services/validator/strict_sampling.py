"""Strict sampling, a catalogue model's option (off by default) for users of Reliquary's rules: a file samples one
way (else `mixed_sampling` fails it), values stay in Reliquary's ranges, and parameters that would change the draw
are accepted only at their neutral value (`<param>_unavailable`). Pure."""

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypeGuard

from services.validator.issues import LineIssue

MAX_SEED = 2**53 - 1
MIN_MAX_TOKENS, MAX_MAX_TOKENS, DEFAULT_MAX_TOKENS = 16, 131_072, 4096
TEMPERATURE_MAX = 4.0

NEUTRAL: dict[str, tuple[object, ...]] = {
    "logprobs": (False,), "top_logprobs": (0,), "frequency_penalty": (0,),
    "presence_penalty": (0,), "repetition_penalty": (1,), "repeat_penalty": (1,), "logit_bias": ({},),
    "stop": ([], ""), "response_format": ({"type": "text"},), "tool_choice": ("auto",), "echo": (False,),
    "suffix": ("",), "best_of": (1,),
}
"""Parameters a strict model takes only at these values (null always counts as neutral)."""

SamplingKey = tuple[object, ...]
"""(temperature, top_p, top_k, min_p, max_tokens, seed, n), defaults filled in: what one file must share."""


def is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_integer(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def sampling_key(body: dict[str, object]) -> SamplingKey:
    top_k = body.get("top_k", -1)
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens", DEFAULT_MAX_TOKENS))
    return (body.get("temperature", 1), body.get("top_p", 1), -1 if top_k in (0, None) else top_k,
            body.get("min_p", 0), max_tokens, body.get("seed"), body.get("n", 1))


def strict_issues(body: dict[str, object]) -> Iterator[LineIssue]:
    yield from _sampler_issues(body)
    yield from _limit_issues(body)
    seed = body.get("seed")
    if seed is not None and (not is_integer(seed) or not 0 <= seed <= MAX_SEED):
        yield LineIssue("invalid_body", f"seed must be an integer from 0 to {MAX_SEED:,}.", "body.seed")
    for name, neutral in NEUTRAL.items():
        value = body.get(name)
        if value is not None and value not in neutral:
            yield LineIssue(f"{name}_unavailable", f"{name} is not offered by this model (only its neutral value "
                            f"{neutral[0]!r} is accepted).", f"body.{name}")


def _sampler_issues(body: dict[str, object]) -> Iterator[LineIssue]:
    temperature = body.get("temperature")
    if temperature == 0:
        yield LineIssue("greedy_unavailable", "Greedy decoding (temperature 0) is not offered: sample with a "
                        f"temperature above 0 and up to {TEMPERATURE_MAX:g}.", "body.temperature")
    elif temperature is not None and (not is_number(temperature) or not 0 < temperature <= TEMPERATURE_MAX):
        yield LineIssue("invalid_body", f"temperature must be above 0 and up to {TEMPERATURE_MAX:g}.",
                        "body.temperature")
    top_p = body.get("top_p")
    if top_p is not None and (not is_number(top_p) or not 0 < top_p <= 1):
        yield LineIssue("invalid_body", "top_p must be above 0 and up to 1.", "body.top_p")
    top_k = body.get("top_k")
    if top_k is not None and (not is_integer(top_k) or top_k < -1):
        yield LineIssue("invalid_body", "top_k must be 0 or -1 (no limit) or a positive integer.", "body.top_k")
    min_p = body.get("min_p")
    if min_p is not None and (not is_number(min_p) or not 0 <= min_p < 1):
        yield LineIssue("invalid_body", "min_p must be from 0 up to, not including, 1.", "body.min_p")


def _limit_issues(body: dict[str, object]) -> Iterator[LineIssue]:
    limits = {name: body[name] for name in ("max_tokens", "max_completion_tokens") if body.get(name) is not None}
    for name, value in limits.items():
        if not is_integer(value) or not MIN_MAX_TOKENS <= value <= MAX_MAX_TOKENS:
            yield LineIssue("invalid_max_tokens", f"{name} must be from {MIN_MAX_TOKENS} to {MAX_MAX_TOKENS:,}.",
                            f"body.{name}")
    if len(set(map(repr, limits.values()))) > 1:
        yield LineIssue("max_tokens_conflict", "max_tokens and max_completion_tokens differ; set one, or both "
                        "equal.", "body.max_completion_tokens")


@dataclass
class OneSampling:
    """The file's one sampling: the first usable line's; a later line sampling otherwise fails the file."""

    first: SamplingKey | None = None
    first_line: int = 0

    def check(self, line_no: int, key: SamplingKey) -> LineIssue | None:
        """None while line `line_no` samples as the file's first usable line did."""
        if self.first is None:
            self.first, self.first_line = key, line_no
            return None
        if key == self.first:
            return None
        return LineIssue("mixed_sampling", f"Line {line_no} samples otherwise than line {self.first_line} "
                         "(temperature, top_p, top_k, min_p, max_tokens, seed and n, omitted ones at their defaults, "
                         "must be the same on every line): split the file into one file per sampling.")
