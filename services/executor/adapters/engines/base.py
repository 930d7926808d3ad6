"""The engine port: what the executor needs from any inference runtime (llama.cpp, TensorRT-LLM, ...)."""

import importlib.metadata
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import ClassVar

from contracts.catalogue import CatalogueModel
from contracts.engines import honoured_parameters
from contracts.events.executor import EngineName
from services.executor.adapters.engines.reply_shape import openai_shaped
from services.executor.adapters.engines.responses import response_body


@dataclass(frozen=True)
class EngineReply:
    """An endpoint's answer to one request line: 2xx with its body, or an error with an OpenAI-shaped error body."""

    status_code: int
    body: dict[str, object]

    @property
    def ok(self) -> bool:
        return 200 <= self.status_code < 300


def error_reply(status_code: int, message: str, code: str | None = None) -> EngineReply:
    kind = "invalid_request_error" if status_code < 500 else "server_error"
    error = {"message": message, "type": kind, "param": None, "code": code}
    return EngineReply(status_code, {"error": error})


def installed(package: str) -> str:
    """The installed release of an engine library, or "not-installed"."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not-installed"


ENGINE_SLOT: ContextVar[int | None] = ContextVar("engine_slot", default=None)
"""The engine slot the line being run was handed (services/executor/slots.py), or None: the engine picks one."""


@contextmanager
def on_slot(index: int | None) -> Iterator[None]:
    """Run the lines of this block on engine slot `index` (an engine that keeps no prompt per slot ignores it)."""
    token = ENGINE_SLOT.set(index)
    try:
        yield
    finally:
        ENGINE_SLOT.reset(token)


class EngineUnavailable(RuntimeError):
    """The engine cannot serve at all (not loaded, crashed): the whole attempt is retried."""


class Engine(ABC):
    """One loaded model on one runtime. `run` never raises for a bad request line: it replies 4xx."""

    name: ClassVar[EngineName]
    prompt_cache_per_slot: ClassVar[bool] = False
    """Each slot keeps its last prompt's KV cache: lines sharing a prefix go to one slot (ENGINE_SLOT)."""

    @property
    @abstractmethod
    def version(self) -> str: ...

    model: CatalogueModel | None = None

    @property
    def slots(self) -> int:
        """Requests the engine runs at once; the executor keeps that many in flight."""
        return self.model.slots if self.model else 0

    @property
    def release(self) -> str:
        """The engine library's own release, which a catalogue entry's `engine_version` is compared with."""
        return self.version

    def capabilities(self) -> frozenset[str]:
        """Request body parameters this runtime honours at its release (contracts' table, shared with the validator)."""
        return honoured_parameters(self.name, self.release)

    def not_served(self, endpoint: str) -> EngineReply:
        """The line's 400 for an endpoint the loaded model does not serve."""
        assert self.model is not None
        return error_reply(400, f"endpoint {endpoint} is not served by {self.model.id}", "invalid_url")

    def completed(self, endpoint: str, completion: dict[str, object], request: dict[str, object]) -> EngineReply:
        """A successful chat or text completion in OpenAI's shape, or the Response object it amounts to for a
        `/v1/responses` line (`request`: the line's body, whose settings a Response states)."""
        assert self.model is not None
        if endpoint == "/v1/responses":
            return EngineReply(200, response_body(completion, self.model.id, request))
        return EngineReply(200, openai_shaped(endpoint, completion))

    @abstractmethod
    def load(self, model: CatalogueModel) -> None:
        """Load the model's weights; blocking, so call it off the event loop."""

    @abstractmethod
    def unload(self) -> None: ...

    @abstractmethod
    async def run(self, endpoint: str, body: dict[str, object]) -> EngineReply: ...
