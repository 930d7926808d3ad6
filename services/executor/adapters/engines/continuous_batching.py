"""transformers' continuous batching for the transformers engine: each line a request of `ContinuousBatchingManager`
(joining the running batch at the next token) with its own limit, EOS and sampling; a seed or a repetition penalty
runs in the engine's micro-batches instead (`eligible`). The KV cache is sized from the catalogue (slots x context)."""

import asyncio
import contextlib
import dataclasses
import math
import queue
import secrets
from contextlib import AbstractContextManager
from typing import Any, cast

PAGE_TOKENS = 256
"""Tokens per KV cache block (the library's default page size)."""
PER_REQUEST_DEFAULTS = {"temperature": 0.5, "top_k": 50, "top_p": 0.5}
"""Never applied (every request sets all three), but each must be non-neutral for the library to build its processor."""


def available(transformers: Any, network: Any = None) -> bool:
    """Whether transformers has continuous batching with per-request sampling, and the model's attention keeps
    micro-batches usable beside it (an eager-only one does not)."""
    config = getattr(transformers, "ContinuousBatchingConfig", None)
    if config is None or not dataclasses.is_dataclass(config) or not any(
            f.name == "per_request_processors" for f in dataclasses.fields(config)):
        return False
    attention = str(getattr(getattr(network, "config", None), "_attn_implementation", "") or "")
    return "eager" not in attention


def eligible(seed: int | None, repetition_penalty: float) -> bool:
    """Whether a line's sampling can run as a request of the manager (a seed or a penalty cannot)."""
    return seed is None and repetition_penalty == 1.0


def sampling_kwargs(greedy: bool, temperature: float, top_p: float, top_k: int, vocabulary: int) -> dict[str, Any]:
    """The per-request processors' arguments for an OpenAI sampling: greedy is top_k 1; top_k 0 is every token."""
    if greedy:
        return {"temperature": 1.0, "top_k": 1, "top_p": 1.0}
    return {"temperature": float(temperature), "top_k": int(top_k) if top_k > 0 else vocabulary,
            "top_p": float(top_p)}


class ContinuousBatches:
    """One manager per loaded model: started at load, stopped at unload."""

    def __init__(self, transformers: Any, network: Any, slots: int, context_length: int, pad_token_id: int) -> None:
        eos = network.generation_config.eos_token_id
        self.vocabulary = int(network.config.get_text_config().vocab_size)
        defaults = {**PER_REQUEST_DEFAULTS, "top_k": min(PER_REQUEST_DEFAULTS["top_k"], self.vocabulary)}
        generation = transformers.GenerationConfig(do_sample=True, max_new_tokens=context_length,
                                                   eos_token_id=eos, pad_token_id=pad_token_id, **defaults)
        batching = transformers.ContinuousBatchingConfig(
            per_request_processors=True, max_requests_per_batch=slots,
            num_blocks=math.ceil(slots * context_length / PAGE_TOKENS), page_size=PAGE_TOKENS,
            max_batch_tokens=min(8192, context_length))
        self.manager = network.init_continuous_batching(generation_config=generation,
                                                        continuous_batching_config=batching)
        self.manager.start()

    async def generate(self, prompt_ids: list[int], samples: int, limit: int, sampling: dict[str, Any],
                       ignore_eos: bool) -> list[list[int]]:
        """Each sample's generated tokens (an EOS it ended on included, as the library gives them)."""
        loop = asyncio.get_running_loop()
        self._drop_orphans()
        requests = [f"line-{secrets.token_hex(8)}" for _ in range(samples)]
        finished: list[asyncio.Future[Any]] = []
        for request in requests:
            future = loop.create_future()
            self.manager.register_result_handler(request, lambda output, done=future: _finish(done, output))
            finished.append(future)
        try:
            for request in requests:
                added = self.manager.add_request(prompt_ids, request_id=request, max_new_tokens=limit,
                                                 eos_token_id=-1 if ignore_eos else None, **sampling)
                if added is None:
                    raise RuntimeError("the continuous batching manager takes no more requests (stopping)")
            outputs = await asyncio.gather(*finished)
        except BaseException:
            for request in requests:  # cancelled or failed: stop generating, and drop the handler the
                self.manager.cancel_request(request)  # library keeps until a result it never sends for a cancel
                self._forget(request)
            self._drop_orphans()
            raise
        for output in outputs:
            if output.error:
                raise RuntimeError(f"generation failed: {output.error}")
        return [list(output.generated_tokens) for output in outputs]

    def in_flight(self) -> int:
        """Requests whose result is still awaited, and results nobody awaits any more."""
        router = getattr(self.manager, "output_router", None)
        return len(router.result_handlers) + router.output_queue.qsize() if router is not None else 0

    def _drop_orphans(self) -> None:
        """Drop the results without a handler (a line cancelled as it ended) from the library's shared queue."""
        router = getattr(self.manager, "output_router", None)
        if router is None:
            return
        while True:
            try:
                router.output_queue.get_nowait()
            except queue.Empty:
                return

    def _forget(self, request: str) -> None:
        router = getattr(self.manager, "output_router", None)
        if router is not None:
            with router._lock:
                router.result_handlers.pop(request, None)

    @property
    def running(self) -> bool:
        """False once the library's loop has stopped (a fatal error ends it): lines then run as micro-batches."""
        return bool(self.manager.is_running())

    def paused(self) -> AbstractContextManager[None]:
        """The model to the calling thread alone (a micro-batch, whose seed needs torch's random state to itself): the
        manager's loop parks at its next step, keeping its requests and cache, until the block ends."""
        if not self.running:
            return contextlib.nullcontext()
        return cast(AbstractContextManager[None], self.manager.pause())

    def stop(self) -> None:
        """Stop the manager's thread (in-flight requests are failed) and free its cache; blocking."""
        self.manager.stop(block=True, timeout=60, hard_stop=True)
        self.manager.destroy()


def _finish(future: "asyncio.Future[Any]", output: Any) -> None:
    if output.is_finished() and not future.done():
        future.set_result(output)
