"""The TensorRT-LLM engine through its `LLM` API (`generate_async`), for NVIDIA GPUs.

TensorRT-LLM is imported only by `load()`, so this module (and its parameter mapping) works anywhere.
"""

import importlib
import importlib.metadata
import logging
import time
from typing import Any, ClassVar

from contracts.catalogue import CatalogueModel
from contracts.events.executor import EngineName
from contracts.ids import derived_id
from services.executor.adapters.engines.base import Engine, EngineReply, EngineUnavailable, error_reply
from services.executor.adapters.engines.responses import UnmappableRequest, chat_request, response_body
from services.runtime.catalogue import resolve_artifact

log = logging.getLogger(__name__)

DIRECT = ("temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty",
          "repetition_penalty", "ignore_eos", "n", "best_of")
"""OpenAI body parameters that `SamplingParams` takes under the same name and meaning."""
DEFAULT_MAX_TOKENS = 16
"""OpenAI's completions default; TensorRT-LLM's own default (32) would differ from what a user expects."""


def sampling_kwargs(body: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments of `tensorrt_llm.SamplingParams` for an OpenAI chat or completions body."""
    kwargs: dict[str, Any] = {key: body[key] for key in DIRECT if body.get(key) is not None}
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    kwargs["max_tokens"] = limit if limit is not None else DEFAULT_MAX_TOKENS
    stop = body.get("stop")
    if stop is not None:
        kwargs["stop"] = [stop] if isinstance(stop, str) else list(stop)
    logprobs = body.get("logprobs")
    if body.get("top_logprobs") is not None:
        kwargs["logprobs"] = body["top_logprobs"]
    elif isinstance(logprobs, int) and not isinstance(logprobs, bool):
        kwargs["logprobs"] = logprobs
    return kwargs


def _finish_reason(reason: object) -> str:
    return "length" if str(reason) in ("length", "FinishReason.LENGTH") else "stop"


def completion_body(output: Any, endpoint: str, model_id: str, request_key: str) -> dict[str, Any]:
    """The OpenAI chat or text completion a TensorRT-LLM `RequestOutput` amounts to."""
    chat = endpoint != "/v1/completions"
    choices = []
    for index, sequence in enumerate(output.outputs):
        choice: dict[str, Any] = {"index": index, "finish_reason": _finish_reason(sequence.finish_reason)}
        if chat:
            choice["message"] = {"role": "assistant", "content": sequence.text}
        else:
            choice["text"] = sequence.text
        choices.append(choice)
    prompt_tokens = len(output.prompt_token_ids or [])
    generated = sum(len(sequence.token_ids) for sequence in output.outputs)
    return {
        "id": derived_id("chatcmpl-" if chat else "cmpl-", request_key),
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()), "model": model_id, "choices": choices,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": generated,
                  "total_tokens": prompt_tokens + generated},
    }


class TensorRtLlmEngine(Engine):
    name: ClassVar[EngineName] = "tensorrt_llm"

    def __init__(self) -> None:
        self.model: CatalogueModel | None = None
        self._llm: Any = None
        self._sampling_params: Any = None
        self._requests = 0

    @property
    def version(self) -> str:
        try:
            return importlib.metadata.version("tensorrt_llm")
        except importlib.metadata.PackageNotFoundError:
            return "not-installed"

    def load(self, model: CatalogueModel) -> None:
        try:
            trtllm = importlib.import_module("tensorrt_llm")
        except ImportError as error:
            raise EngineUnavailable(
                f"TensorRT-LLM is not installed on this host, so {model.id} cannot load here: run the "
                "tensorrt_llm engine on an NVIDIA GPU host with `tensorrt-llm` installed, or use llamacpp"
            ) from error
        try:
            self._llm = trtllm.LLM(model=str(resolve_artifact(model.artifact)), max_batch_size=model.slots,
                                   max_seq_len=model.context_length)
        except RuntimeError as error:
            raise EngineUnavailable(f"TensorRT-LLM could not load {model.id} (no usable NVIDIA GPU?): "
                                    f"{error}") from error
        self._sampling_params = trtllm.SamplingParams
        self.model = model
        log.info("loaded %s on TensorRT-LLM (%d sequences x %d tokens)", model.id, model.slots,
                 model.context_length)

    def unload(self) -> None:
        if self._llm is not None:
            self._llm.shutdown()
        self._llm = self._sampling_params = self.model = None

    async def run(self, endpoint: str, body: dict[str, object]) -> EngineReply:
        if self._llm is None or self.model is None:
            raise EngineUnavailable("no model is loaded")
        if endpoint not in self.model.endpoints or endpoint == "/v1/embeddings":
            return error_reply(400, f"endpoint {endpoint} is not served by {self.model.id}", "invalid_url")
        try:
            request = chat_request(body) if endpoint == "/v1/responses" else dict(body)
            prompt = self._prompt(endpoint, request)
            params = self._sampling_params(**sampling_kwargs(request))
        except (UnmappableRequest, ValueError, TypeError) as error:
            return error_reply(400, str(error), "invalid_request")
        self._requests += 1
        output = await self._llm.generate_async(prompt, params)
        completion = completion_body(output, endpoint, self.model.id, f"{id(self)}:{self._requests}")
        if endpoint == "/v1/responses":
            return EngineReply(200, response_body(completion, self.model.id))
        return EngineReply(200, completion)

    def _prompt(self, endpoint: str, request: dict[str, Any]) -> str:
        if endpoint == "/v1/completions":
            prompt = request.get("prompt")
            if not isinstance(prompt, str):
                raise UnmappableRequest("prompt must be a string")
            return prompt
        messages = request.get("messages")
        if not isinstance(messages, list):
            raise UnmappableRequest("messages must be a list")
        return str(self._llm.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
