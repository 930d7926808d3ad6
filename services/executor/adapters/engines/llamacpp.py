"""The llama.cpp engine through xllamacpp: GGUF models, continuous batching over `slots` sequences.

xllamacpp calls block but release the GIL, so they run in a thread pool with one worker per slot.
"""

import asyncio
import importlib.metadata
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

import xllamacpp

from contracts.catalogue import CatalogueModel
from contracts.events.executor import EngineName
from services.executor.adapters.engines.base import Engine, EngineReply, EngineUnavailable, error_reply
from services.runtime.catalogue import resolve_artifact

log = logging.getLogger(__name__)

CAPABILITIES = frozenset({
    "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p",
    "seed", "stop", "presence_penalty", "frequency_penalty", "repeat_penalty", "logit_bias", "logprobs",
    "top_logprobs", "response_format", "n_probs", "ignore_eos", "tools", "tool_choice", "user", "model",
})


class LlamaCppEngine(Engine):
    name: ClassVar[EngineName] = "llamacpp"

    def __init__(self, n_threads: int) -> None:
        self.n_threads = n_threads
        self.model: CatalogueModel | None = None
        self._server: xllamacpp.Server | None = None
        self._pool: ThreadPoolExecutor | None = None

    @property
    def version(self) -> str:
        return importlib.metadata.version("xllamacpp")

    @property
    def slots(self) -> int:
        return self.model.slots if self.model else 0

    def capabilities(self) -> frozenset[str]:
        return CAPABILITIES

    def load(self, model: CatalogueModel) -> None:
        params = xllamacpp.CommonParams()
        params.model.path = str(resolve_artifact(model.artifact))
        params.model_alias = model.id
        params.n_parallel = model.slots
        # n_ctx is the total, split evenly across slots: each slot gets the model's context length.
        params.n_ctx = model.slots * model.context_length
        params.cpuparams.n_threads = self.n_threads
        params.cpuparams_batch.n_threads = self.n_threads
        self._server = xllamacpp.Server(params)
        self._pool = ThreadPoolExecutor(max_workers=model.slots, thread_name_prefix=f"llamacpp-{model.id}")
        self.model = model
        log.info("loaded %s (%d slots x %d tokens)", model.id, model.slots, model.context_length)

    def unload(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._server = self._pool = self.model = None

    async def run(self, endpoint: str, body: dict[str, object]) -> EngineReply:
        if self._server is None or self._pool is None or self.model is None:
            raise EngineUnavailable("no model is loaded")
        call = self._handler(self._server, endpoint)
        if call is None:
            return error_reply(400, f"endpoint {endpoint} is not served by {self.model.id}", "invalid_url")
        request = {key: value for key, value in body.items() if key != "stream"}
        try:
            result = await asyncio.get_running_loop().run_in_executor(self._pool, call, request)
        except ValueError as error:
            # xllamacpp raises ValueError for a malformed request; that is the line's fault, not ours.
            return error_reply(400, str(error), "invalid_request")
        return self._reply(self.model.id, result)

    @staticmethod
    def _handler(server: xllamacpp.Server, endpoint: str) -> Callable[[dict[str, Any]], Any] | None:
        handlers: dict[str, Callable[[dict[str, Any]], Any]] = {
            "/v1/chat/completions": server.handle_chat_completions,
            "/v1/completions": server.handle_completions,
        }
        return handlers.get(endpoint)

    @staticmethod
    def _reply(model_id: str, result: dict[str, Any]) -> EngineReply:
        error = result.get("error")
        if isinstance(error, dict):
            status = error.get("code")
            status_code = status if isinstance(status, int) and 400 <= status < 600 else 500
            return error_reply(status_code, str(error.get("message", "engine error")), error.get("type"))
        result.pop("timings", None)
        result["model"] = model_id
        return EngineReply(200, result)
