"""The `simulated` engine: answers each line at once with a fixed body, computing nothing, to drive the control plane
at its own limit (`bench/control_plane.py`); only a catalogue entry naming it uses it. Usage is derived from the request
(four characters a prompt token; `max_tokens`, else 16, completion tokens) so billing sees realistic figures."""

import time
from typing import ClassVar

from contracts.catalogue import CatalogueModel
from contracts.events.executor import EngineName
from services.executor.adapters.engines.base import Engine, EngineReply, EngineUnavailable

DEFAULT_COMPLETION_TOKENS = 16
REPLY_TEXT = "simulated"
VERSION = "1.0"


def prompt_tokens(body: dict[str, object]) -> int:
    text = str(body.get("messages") or body.get("prompt") or body.get("input") or "")
    return max(1, len(text) // 4)


def completion_tokens(body: dict[str, object]) -> int:
    for name in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return DEFAULT_COMPLETION_TOKENS


class SimulatedEngine(Engine):
    name: ClassVar[EngineName] = "simulated"

    @property
    def version(self) -> str:
        return VERSION

    def load(self, model: CatalogueModel) -> None:
        self.model = model

    def unload(self) -> None:
        self.model = None

    async def run(self, endpoint: str, body: dict[str, object]) -> EngineReply:
        model = self.model
        if model is None:
            raise EngineUnavailable("no model is loaded")
        if endpoint not in model.endpoints:
            return self.not_served(endpoint)
        usage_in, usage_out = prompt_tokens(body), completion_tokens(body)
        usage = {"prompt_tokens": usage_in, "completion_tokens": usage_out, "total_tokens": usage_in + usage_out}
        created = int(time.time())
        if endpoint == "/v1/embeddings":
            return EngineReply(200, {"object": "list", "model": model.id, "data": [
                {"object": "embedding", "index": 0, "embedding": [0.0] * 8}],
                "usage": {"prompt_tokens": usage_in, "total_tokens": usage_in}})
        if endpoint == "/v1/completions":
            return EngineReply(200, {"id": f"cmpl-sim-{created}", "object": "text_completion", "created": created,
                                     "model": model.id, "choices": [{"index": 0, "text": REPLY_TEXT,
                                                                     "finish_reason": "length", "logprobs": None}],
                                     "usage": usage})
        chat = {"id": f"chatcmpl-sim-{created}", "object": "chat.completion", "created": created, "model": model.id,
                "choices": [{"index": 0, "finish_reason": "length",
                             "message": {"role": "assistant", "content": REPLY_TEXT}}], "usage": usage}
        return self.completed(endpoint, chat, body)
