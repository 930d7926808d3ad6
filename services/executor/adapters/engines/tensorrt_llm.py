"""The TensorRT-LLM engine (`LLM.generate_async`) for NVIDIA GPUs, behaving as `trtllm-serve` does: OpenAI's defaults,
`hf_prompts.py` prompts, a line's own 400 or 500, its KV cache sized from the catalogue (slots x context) rather than
90 % of free GPU memory. TensorRT-LLM is imported only by `load()`, so the mapping works anywhere."""

import asyncio
import gc
import importlib
import logging
import os
from typing import Any, ClassVar

from contracts.catalogue import CatalogueModel
from contracts.events.executor import EngineName
from services.executor.adapters.engines.base import Engine, EngineReply, EngineUnavailable, error_reply, installed
from services.executor.adapters.engines.generation_rules import COMPLETIONS_DEFAULT_MAX_TOKENS
from services.executor.adapters.engines.hf_prompts import completion, prompt_text, text_choice
from services.executor.adapters.engines.responses import UnmappableRequest, chat_request
from services.runtime.storage.catalogue import resolve_artifact

log = logging.getLogger(__name__)

DIRECT = ("temperature", "top_p", "top_k", "seed", "ignore_eos", "n", "best_of",
          "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p")
"""OpenAI body parameters `SamplingParams` takes as they are (the penalties and min_p reach a line only on a release
that honours them: `contracts/engines.py`, `shelf.servable_at_release`)."""
DEFAULT_SAMPLING = {"temperature": 1.0, "top_p": 1.0}
"""What `trtllm-serve` fills in for a request that names neither (TensorRT-LLM alone would decode greedily)."""
FINISHED = {"stop": "stop", "length": "length"}
"""TensorRT-LLM's finish reasons a successful line may end with; `cancelled` and `timeout` are failures."""
TOO_LONG_HINTS = ("max_num_tokens", "max_seq_len", "prompt length", "exceed")


def sampling_kwargs(body: dict[str, Any], endpoint: str = "/v1/chat/completions") -> dict[str, Any]:
    """Keyword arguments of `tensorrt_llm.SamplingParams` for an OpenAI chat or completions body."""
    kwargs: dict[str, Any] = {**DEFAULT_SAMPLING, **{key: body[key] for key in DIRECT if body.get(key) is not None}}
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is None and endpoint == "/v1/completions":
        limit = COMPLETIONS_DEFAULT_MAX_TOKENS
    kwargs["max_tokens"] = limit  # None: TensorRT-LLM runs to the context (max_seq_len less the prompt)
    stop = body.get("stop")
    if stop is not None:
        kwargs["stop"] = [stop] if isinstance(stop, str) else list(stop)
    wanted = logprobs_wanted(body)
    if wanted is not None:
        kwargs["logprobs"] = wanted
    # A chat prompt is the template's text, which already holds BOS and the role markers.
    kwargs["add_special_tokens"] = endpoint == "/v1/completions"
    return kwargs


def logprobs_wanted(body: dict[str, Any]) -> int | None:
    """How many alternatives per token a line asks logprobs for (0: only the chosen token's); None: none."""
    logprobs = body.get("logprobs")
    if logprobs is True or body.get("top_logprobs") is not None:
        return int(body.get("top_logprobs") or 0)
    if isinstance(logprobs, int) and not isinstance(logprobs, bool):
        return logprobs  # completions: the number of alternatives
    return None


def _token_text(tokenizer: Any, token_id: int) -> str:
    return str(tokenizer.decode([token_id])) if tokenizer is not None else str(token_id)


def _positions(sequence: Any) -> list[tuple[int, float, list[tuple[int, float]]]]:
    """(chosen token, its logprob, the alternatives best first) per token, from a dict of `Logprob`s or a float."""
    found = []
    for index, entry in enumerate(sequence.logprobs or []):
        chosen = sequence.token_ids[index] if index < len(sequence.token_ids) else -1
        if isinstance(entry, dict):
            ranked = sorted(entry.items(), key=lambda item: (getattr(item[1], "rank", None) or 0, -item[1].logprob))
            own = entry.get(chosen)
            found.append((chosen, own.logprob if own is not None else ranked[0][1].logprob,
                          [(token, lp.logprob) for token, lp in ranked]))
        else:
            found.append((chosen, float(entry), []))
    return found


def chat_logprobs(sequence: Any, tokenizer: Any, top: int) -> dict[str, Any]:
    content = []
    for chosen, logprob, alternatives in _positions(sequence):
        text = _token_text(tokenizer, chosen)
        content.append({"token": text, "logprob": logprob, "bytes": list(text.encode()),
                        "top_logprobs": [{"token": (alt := _token_text(tokenizer, token)), "logprob": value,
                                          "bytes": list(alt.encode())} for token, value in alternatives[:top]]})
    return {"content": content}


def completion_logprobs(sequence: Any, tokenizer: Any, top: int) -> dict[str, Any]:
    tokens, values, tops, offsets, offset = [], [], [], [], 0
    for chosen, logprob, alternatives in _positions(sequence):
        text = _token_text(tokenizer, chosen)
        tokens.append(text)
        values.append(logprob)
        tops.append({_token_text(tokenizer, token): value for token, value in alternatives[:top]})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


class LineCancelled(Exception):
    """TensorRT-LLM ended the line `cancelled` or `timeout`: it did not finish."""


def completion_body(output: Any, endpoint: str, model_id: str, tokenizer: Any = None,
                    logprobs: int | None = None, fingerprint: str = "trtllm") -> dict[str, Any]:
    """The OpenAI chat or text completion a TensorRT-LLM `RequestOutput` amounts to."""
    chat = endpoint != "/v1/completions"
    choices = []
    for index, sequence in enumerate(output.outputs):
        reason = str(sequence.finish_reason)
        if reason not in FINISHED:
            raise LineCancelled(f"TensorRT-LLM ended the request {reason!r}")
        choice = text_choice(index, FINISHED[reason], sequence.text, chat)
        if logprobs is not None:
            choice["logprobs"] = (chat_logprobs if chat else completion_logprobs)(sequence, tokenizer, logprobs)
        choices.append(choice)
    generated = sum(len(sequence.token_ids) for sequence in output.outputs)
    return completion(chat, model_id, choices, len(output.prompt_token_ids or []), generated,
                      int(getattr(output, "cached_tokens", 0) or 0), fingerprint)


def refusal_of(error: Exception) -> EngineReply:
    """A line TensorRT-LLM refused before running it: too long for the engine, or otherwise invalid."""
    message = str(error)
    if any(hint in message for hint in TOO_LONG_HINTS):
        return error_reply(400, f"The prompt does not fit this model's engine: {message}", "context_too_long")
    return error_reply(400, message or type(error).__name__, "invalid_request")


class TensorRtLlmEngine(Engine):
    name: ClassVar[EngineName] = "tensorrt_llm"

    def __init__(self) -> None:
        self._llm: Any = None
        self._trtllm: Any = None

    @property
    def version(self) -> str:
        return installed("tensorrt_llm")

    def load(self, model: CatalogueModel) -> None:
        try:
            trtllm = importlib.import_module("tensorrt_llm")
        except ImportError as error:
            raise EngineUnavailable(
                f"TensorRT-LLM is not installed on this host, so {model.id} cannot load here: run the "
                "tensorrt_llm engine on an NVIDIA GPU host with `tensorrt-llm` installed, or use llamacpp"
            ) from error
        # OpenAI's `n` > 1 at temperature 0 gives n equal answers; TensorRT-LLM refuses it unless told.
        os.environ.setdefault("TLLM_ALLOW_N_GREEDY_DECODING", "1")
        kv_cache = trtllm.KvCacheConfig(max_tokens=model.slots * model.context_length, enable_block_reuse=True)
        try:
            self._llm = trtllm.LLM(model=str(resolve_artifact(model.artifact)), max_batch_size=model.slots,
                                   max_seq_len=model.context_length, max_num_tokens=model.context_length,
                                   kv_cache_config=kv_cache)
        except (RuntimeError, ValueError, OSError) as error:
            raise EngineUnavailable(f"TensorRT-LLM could not load {model.id} (no usable NVIDIA GPU, or an "
                                    f"artifact it cannot read?): {error}") from error
        self._trtllm = trtllm
        self.model = model
        log.info("loaded %s on TensorRT-LLM %s (%d sequences x %d tokens of KV cache)", model.id, self.version,
                 model.slots, model.context_length)

    def unload(self) -> None:
        if self._llm is not None:
            self._llm.shutdown()
        self._llm = self._trtllm = self.model = None
        gc.collect()
        try:
            torch = importlib.import_module("torch")
        except ImportError:
            return
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    async def run(self, endpoint: str, body: dict[str, object]) -> EngineReply:
        if self._llm is None or self.model is None:
            raise EngineUnavailable("no model is loaded")
        if endpoint not in self.model.endpoints or endpoint == "/v1/embeddings":
            return self.not_served(endpoint)
        try:
            request = chat_request(body) if endpoint == "/v1/responses" else dict(body)
            prompt = prompt_text(self._llm.tokenizer, endpoint, request)
            params = self._trtllm.SamplingParams(**sampling_kwargs(request, endpoint))
        except UnmappableRequest as error:
            return error_reply(400, str(error), "invalid_request")
        except Exception as error:  # jinja2's TemplateError, SamplingParams' ValueError: the line's own fault
            return refusal_of(error)
        output = await self._output(prompt, params)
        if isinstance(output, EngineReply):
            return output
        try:
            answer = completion_body(output, endpoint, self.model.id, self._llm.tokenizer,
                                     logprobs_wanted(request), f"trtllm-{self.version}")
        except LineCancelled as cancelled:
            return error_reply(503, str(cancelled), "engine_cancelled")
        return self.completed(endpoint, answer, body)

    async def _output(self, prompt: str, params: Any) -> Any:
        """The engine's output for the request; or the line's refusal, or a 500 when the engine failed it."""
        try:
            pending = self._llm.generate_async(prompt, params)
        except RuntimeError as error:
            _unless_shutting_down(error)
            return refusal_of(error)  # RequestError (a RuntimeError) for a prompt over its limits
        except ValueError as error:
            return refusal_of(error)
        try:
            return await pending
        except asyncio.CancelledError:
            pending.abort()  # the line's task was cancelled: stop its request on the GPU too
            raise
        except RuntimeError as error:
            _unless_shutting_down(error)
            return error_reply(500, f"TensorRT-LLM failed the request: {error}", "engine_error")


def _unless_shutting_down(error: RuntimeError) -> None:
    """An engine shutting down fails the attempt (which reloads it), not the line."""
    if "shutting down" in str(error):
        raise EngineUnavailable(f"TensorRT-LLM is shutting down: {error}") from error
