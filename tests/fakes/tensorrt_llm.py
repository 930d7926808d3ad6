"""A fake of the parts of TensorRT-LLM's LLM API the engine adapter uses, shaped as its source has them
(`tensorrt_llm/llmapi/llm.py`, `executor/result.py`, `executor/utils.py`, `sampling_params.py`, `llm_args.py`):
`RequestOutput` with `prompt_token_ids`, `outputs` of `CompletionOutput` (`text`, `token_ids`, `finish_reason` one of
"stop", "length", "timeout", "cancelled", `logprobs` as a dict of `Logprob` per position) and `cached_tokens`; the
awaitable `GenerationResult` with `abort()`; `RequestError(RuntimeError)`; `generate_async` raising
`RuntimeError("LLM is shutting down")` after `shutdown()` and `ValueError` for a prompt over `max_num_tokens`;
`SamplingParams` refusing several returns from greedy decoding unless `TLLM_ALLOW_N_GREEDY_DECODING` is set.

Installed as the `tensorrt_llm` module for a test (`install`); tokens are whitespace-separated words."""

import asyncio
import os
import sys
import types
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import jinja2


class Logprob(NamedTuple):
    logprob: float
    rank: int | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: list[dict[int, Logprob]] | list[float] | None = None
    cumulative_logprob: float | None = None


@dataclass
class RequestOutput:
    request_id: int
    prompt: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True
    cached_tokens: int = 0


class RequestError(RuntimeError):
    """tensorrt_llm.executor.utils.RequestError: one request's failure, raised when its result is awaited."""


@dataclass
class SamplingParams:
    max_tokens: int | None = 32
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: list[str] | None = None
    n: int = 1
    best_of: int | None = None
    logprobs: int | None = None
    ignore_eos: bool = False
    add_special_tokens: bool = True
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    min_p: float | None = None

    def __post_init__(self) -> None:
        best_of = self.best_of or self.n
        if best_of < self.n:
            raise ValueError(f"best_of ({best_of}) cannot be less than n ({self.n})")
        greedy = ((self.temperature is None and self.top_p is None and self.top_k is None) or self.top_k == 1
                  or self.top_p == 0.0 or self.temperature == 0)
        if best_of > 1 and greedy and not os.environ.get("TLLM_ALLOW_N_GREEDY_DECODING"):
            raise ValueError("Greedy decoding in the LLM API does not allow multiple returns. Please set to "
                             f"best_of=1, got best_of={best_of}.")


class KvCacheConfig:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs


class Tokenizer:
    """A chat template that writes BOS and role markers itself, and refuses a `tool` message without an id."""

    def __init__(self) -> None:
        self.rendered: list[list[dict[str, Any]]] = []

    def apply_chat_template(self, conversation: list[dict[str, Any]], tokenize: bool = True,
                            add_generation_prompt: bool = False, **kwargs: Any) -> str:
        assert tokenize is False and add_generation_prompt is True
        self.rendered.append(conversation)
        for message in conversation:
            if message["role"] == "tool" and "tool_call_id" not in message:
                raise jinja2.TemplateError("tool messages need a tool_call_id")
            if not isinstance(message["content"], str):
                raise TypeError("can only concatenate str")  # what a raw list would do in a real template
        return "<s> " + " ".join(f"<{m['role']}> {m['content']}" for m in conversation) + " <assistant>"

    def decode(self, ids: list[int]) -> str:
        return "".join(f"t{token}" for token in ids)


Script = Callable[[str, SamplingParams], RequestOutput | BaseException]


class GenerationResult:
    """What `LLM.generate_async` returns: awaitable (its `__await__` is `aresult()`'s), with `abort()`."""

    def __init__(self, make: Callable[[], RequestOutput | BaseException], delay_s: float) -> None:
        self.make = make
        self.delay_s = delay_s
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True

    async def aresult(self) -> RequestOutput:
        await asyncio.sleep(self.delay_s)
        outcome = self.make()
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def __await__(self) -> Generator[Any, None, RequestOutput]:
        return self.aresult().__await__()


def words(text: str) -> list[int]:
    return [len(word) for word in text.split()]


def default_script(prompt: str, params: SamplingParams) -> RequestOutput:
    limit = params.max_tokens if params.max_tokens is not None else 5
    produced = [7, 8, 9][:limit]
    outputs = [CompletionOutput(index=i, text=" ".join(f"w{t}" for t in produced), token_ids=list(produced),
                                finish_reason="length" if limit <= len(produced) else "stop",
                                logprobs=[{t: Logprob(-0.5, 1), t + 1: Logprob(-1.5, 2)} for t in produced]
                                if params.logprobs is not None else None)
               for i in range(params.n)]
    return RequestOutput(request_id=1, prompt=prompt, prompt_token_ids=words(prompt), outputs=outputs,
                         cached_tokens=2)


class LLM:
    instances: list["LLM"] = []

    def __init__(self, model: str, **kwargs: Any) -> None:
        self.model = model
        self.kwargs = kwargs
        self.tokenizer = Tokenizer()
        self.calls: list[tuple[str, SamplingParams]] = []
        self.results: list[GenerationResult] = []
        self.script: Script = default_script
        self.delay_s = 0.0
        self.is_shut_down = False
        LLM.instances.append(self)

    def generate_async(self, prompt: str, sampling_params: SamplingParams) -> GenerationResult:
        if self.is_shut_down:
            raise RuntimeError("LLM is shutting down")
        limit = self.kwargs.get("max_num_tokens", 8192)
        if len(words(prompt)) > limit:
            raise ValueError(f"The sum of prompt length ({len(words(prompt))}), query length (0) should not exceed "
                             f"max_num_tokens ({limit})")
        self.calls.append((prompt, sampling_params))
        result = GenerationResult(lambda: self.script(prompt, sampling_params), self.delay_s)
        self.results.append(result)
        return result

    def shutdown(self) -> None:
        self.is_shut_down = True


def install() -> types.ModuleType:
    """Put the fake in `sys.modules` as `tensorrt_llm` (the caller removes it)."""
    module = types.ModuleType("tensorrt_llm")
    module.LLM = LLM  # type: ignore[attr-defined]
    module.SamplingParams = SamplingParams  # type: ignore[attr-defined]
    module.KvCacheConfig = KvCacheConfig  # type: ignore[attr-defined]
    module.RequestError = RequestError  # type: ignore[attr-defined]
    sys.modules["tensorrt_llm"] = module
    LLM.instances.clear()
    return module
