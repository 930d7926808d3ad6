"""The llama.cpp engine through xllamacpp: GGUF models, continuous batching over `slots` sequences; chat, completions,
responses (mapped onto chat) and embeddings. Calls block but release the GIL: they run in a pool of one thread per slot,
streamed where the answer can be rebuilt (`streamed_reply`), so a cancelled line stops at its next token."""

import asyncio
import importlib.metadata
import logging
import secrets
import threading
import typing
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

import xllamacpp

from contracts.api.request_line import completion_prompts
from contracts.catalogue import CatalogueModel
from contracts.events.executor import EngineName
from services.executor.adapters.engines.base import ENGINE_SLOT, Engine, EngineReply, EngineUnavailable, error_reply
from services.executor.adapters.engines.responses import UnmappableRequest, chat_request
from services.executor.adapters.engines.streamed_reply import STREAM_OPTIONS, StreamedReply, one_answer, streamable
from services.runtime.storage.catalogue import resolve_artifact

log = logging.getLogger(__name__)

LINE_REJECTIONS = (ValueError, TypeError, RuntimeError)
"""How xllamacpp refuses a line, the line's fault: malformed, unserialisable, or content llama.cpp cannot read (its
std::exception). A crashed engine shows as EngineUnavailable before the call, never from it."""
PROMPT_CACHE_RAM_MIB = 64
"""llama.cpp's host-memory prompt cache defaults to 8 GiB, so an executor grew by hundreds of MB per thousand distinct
lines (measured: 0.6 to 1.7 GB within 1,600 lines). Lines sharing a prefix reuse their slot's own KV cache instead
(`id_slot`, prefixes.py); a 1,000-token SmolLM2 prompt takes 22 MiB, so this holds two or three."""
ENGINE_THREAD_POLL = 0
"""llama.cpp's compute threads spin between graph steps by default (poll 50), burning cores others on the host need:
on 2 cores, two executors took 94 s spinning vs 50 s with poll 0 (one executor alone: 9.7 s vs 8.5 s)."""
EMBEDDINGS = "/v1/embeddings"
COMPLETIONS = "/v1/completions"
RESPONSES = "/v1/responses"
HANDLERS = {"/v1/chat/completions": "handle_chat_completions", COMPLETIONS: "handle_completions",
            RESPONSES: "handle_chat_completions", EMBEDDINGS: "handle_embeddings"}
"""The server's call for each endpoint (a Responses request runs as the chat request it maps onto)."""


SERVER_STOP_S = 30.0
"""How long unloading waits for llama.cpp's server to stop, on a daemon thread: its destructor joins the server's loop
thread holding the GIL, so a loop that never ends (a lost stop, which `load` rules out) would freeze the process."""


class LlamaCppEngine(Engine):
    name: ClassVar[EngineName] = "llamacpp"
    prompt_cache_per_slot: ClassVar[bool] = True

    def __init__(self, n_threads: int) -> None:
        self.n_threads = n_threads
        self._server: xllamacpp.Server | None = None
        self._pool: ThreadPoolExecutor | None = None

    @property
    def version(self) -> str:
        return importlib.metadata.version("xllamacpp")

    def load(self, model: CatalogueModel) -> None:
        server = xllamacpp.Server(self.params_for(model))
        # Once a metrics task is answered the server's loop runs: stopping a loop not started yet loses the stop, and
        # the destructor then waits for ever.
        server.handle_metrics()
        self._server = server
        self._pool = ThreadPoolExecutor(max_workers=model.slots, thread_name_prefix=f"llamacpp-{model.id}")
        self.model = model
        log.info("loaded %s (%d slots x %d tokens)", model.id, model.slots, model.context_length)

    def params_for(self, model: CatalogueModel) -> xllamacpp.CommonParams:
        params = xllamacpp.CommonParams()
        params.model.path = str(resolve_artifact(model.artifact))
        params.model_alias = model.id
        params.n_parallel = model.slots
        # n_ctx is the total, split evenly across slots: each slot gets the model's context length.
        params.n_ctx = model.slots * model.context_length
        params.cpuparams.n_threads = self.n_threads
        params.cpuparams_batch.n_threads = self.n_threads
        params.cpuparams.poll = params.cpuparams_batch.poll = ENGINE_THREAD_POLL
        if EMBEDDINGS in model.endpoints:
            # A causal model pools nothing by default, and llama.cpp refuses to embed without pooling.
            params.embedding = True
            params.pooling_type = xllamacpp.llama_pooling_type.LLAMA_POOLING_TYPE_MEAN
        params.cache_ram_mib = PROMPT_CACHE_RAM_MIB
        # llama.cpp's server also listens on a loopback HTTP port, which every local user reaches: a key nobody
        # knows (we call it in-process) and no slot or web pages keep its lines and prompts to this process.
        params.api_keys = [secrets.token_urlsafe(32)]
        params.endpoint_slots = False
        params.endpoint_metrics = True  # only counters (and behind the key): `load` waits for the loop with it
        params.ui = False
        return params

    def unload(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        if self._server is not None:
            holder, self._server = [self._server], None  # the list holds the only reference: dropped on its thread
            stopper = threading.Thread(target=holder.clear, name="llamacpp-stop", daemon=True)
            stopper.start()
            stopper.join(SERVER_STOP_S)
            if stopper.is_alive():
                log.error("llama.cpp's server did not stop within %.0f s; left to stop on its own", SERVER_STOP_S)
        self._pool = self.model = None

    async def run(self, endpoint: str, body: dict[str, object]) -> EngineReply:
        if self._server is None or self._pool is None or self.model is None:
            raise EngineUnavailable("no model is loaded")
        if endpoint not in self.model.endpoints or endpoint not in HANDLERS:
            return self.not_served(endpoint)
        try:
            request = self._request(endpoint, body)
        except UnmappableRequest as error:
            return error_reply(400, str(error), "invalid_request")
        line = LineCall(getattr(self._server, HANDLERS[endpoint]), request, endpoint)
        try:
            running = asyncio.get_running_loop().run_in_executor(self._pool, line.answer)
        except RuntimeError as error:  # the pool is shut down: the model is being unloaded
            raise EngineUnavailable(f"{self.model.id} is unloading") from error
        try:
            result = await running
        except LINE_REJECTIONS as error:
            return error_reply(400, f"{self.model.id} on llama.cpp refused the request: {error}", "invalid_request")
        finally:
            line.stop.set()  # a line cancelled (its batch's cancel or expiry) stops at its next token, freeing the slot
        reply = self._reply(self.model.id, result)
        return self.completed(endpoint, reply.body, body) if reply.ok else reply

    def _request(self, endpoint: str, body: dict[str, object]) -> dict[str, Any]:
        """The line's body as llama.cpp takes it (Responses mapped onto chat), on the slot the line was handed."""
        assert self.model is not None
        request = {key: value for key, value in body.items() if key not in ("stream", "stream_options", "id_slot")}
        if endpoint == RESPONSES:
            request = chat_request(request)
        if request.get("top_logprobs") == 0 and request.get("logprobs") is not True:
            del request["top_logprobs"]  # neutral, so the validator accepts it; llama.cpp refuses it without logprobs
        slot = ENGINE_SLOT.get()
        if slot is not None and 0 <= slot < self.model.slots and endpoint != EMBEDDINGS:
            # Queued on that slot, whose cached prompt serves the prefix this line shares with the one before it.
            request["id_slot"] = slot
        return request

    @staticmethod
    def _reply(model_id: str, result: dict[str, Any]) -> EngineReply:
        error = result.get("error")
        if "error" not in result and result.get("type") == "server_error":
            # xllamacpp's own shape when it could not read llama.cpp's answer back.
            return error_reply(500, str(result.get("message", "engine error")), "server_error")
        if isinstance(error, dict):
            status = error.get("code")
            status_code = status if isinstance(status, int) and 400 <= status < 600 else 500
            return error_reply(status_code, str(error.get("message", "engine error")), error.get("type"))
        timings = result.pop("timings", None)
        usage = result.get("usage")
        if isinstance(usage, dict) and result.get("object") in ("chat.completion", "text_completion"):
            usage["prompt_tokens_details"] = _prompt_details(usage.get("prompt_tokens_details"), timings)
        result["model"] = model_id
        return EngineReply(200, result)


class LineCall:
    """One line's call of llama.cpp on a pool thread (`answer`), streamed where it can be so that `stop` ends it."""

    def __init__(self, call: Callable[..., Any], request: dict[str, Any], endpoint: str) -> None:
        self.call = call
        self.request = request
        self.endpoint = endpoint
        self.chat = endpoint != COMPLETIONS
        self.prompts = 1 if self.chat else completion_prompts(request.get("prompt"))
        """The choices the answer holds: one per prompt of a completions line."""
        self.streamed = StreamedReply(chat=self.chat, expected_choices=self.prompts)
        self.stop = threading.Event()
        self.failures: list[BaseException] = []

    def answer(self) -> dict[str, Any]:
        if self.endpoint == EMBEDDINGS or not streamable(self.request):
            return self._unstreamed()
        try:
            self.call({**self.request, "stream": True, "stream_options": STREAM_OPTIONS}, self._on_chunk)
        except LINE_REJECTIONS as error:
            if not self.streamed.seen:
                raise  # refused before it started, as the unstreamed call refuses it: the line's fault
            self.failures.append(error)  # llama.cpp's partial parse of a stream failing, not the request
        if self.failures and not self.stop.is_set():
            log.warning("streaming a %s line failed (%s); running it unstreamed", self.endpoint, self.failures[0])
            return self._unstreamed()
        return self.streamed.reply()

    def _on_chunk(self, chunk: object) -> bool:
        try:
            self.streamed.take(chunk)
        except Exception as error:  # ours, not the line's (xllamacpp would swallow it and end the stream)
            self.failures.append(error)
            return True
        return self.stop.is_set()  # True ends the stream

    def _unstreamed(self) -> dict[str, Any]:
        if self.prompts == 1:
            return dict(self.call(self.request))
        answers = []
        for prompt in typing.cast(list[object], self.request["prompt"]):
            if self.stop.is_set():  # cancelled: the line's answer is dropped, its other prompts need not run
                return {"type": "server_error", "message": "the line was stopped"}
            answers.append(dict(self.call({**self.request, "prompt": prompt})))
        return one_answer(answers)


def _prompt_details(reported: object, timings: object) -> dict[str, Any]:
    """OpenAI's `prompt_tokens_details` with the `cached_tokens` llama.cpp reports (else its timings' `cache_n`)."""
    details = dict(reported) if isinstance(reported, dict) else {}
    if not isinstance(details.get("cached_tokens"), int):
        cache_n = timings.get("cache_n") if isinstance(timings, dict) else None
        details["cached_tokens"] = cache_n if isinstance(cache_n, int) else 0
    return details
