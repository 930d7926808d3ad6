"""llama.cpp's streamed answer to one request, put back together as the answer it gives unstreamed.

The llama.cpp adapter asks for every completion streamed, only so that it can stop one: xllamacpp's unstreamed call
cannot be interrupted (the request it builds carries a `should_stop` that never says stop), while a stream ends, and
llama.cpp frees the slot, as soon as the chunk callback says so. What the line gets is the unstreamed shape, field
for field (tests/unit/executor/test_executor_llamacpp.py compares the two on the real model), except that a
completions line of several prompts states the usage of all of them, where llama.cpp's unstreamed answer states its
first prompt's only.
"""

from dataclasses import dataclass, field
from typing import Any

STREAM_OPTIONS = {"include_usage": True}
"""A chat stream states its usage (and timings) in a last chunk only when asked; a completions stream always does."""
USAGE_COUNTS = ("completion_tokens", "prompt_tokens", "total_tokens")


@dataclass
class ToolCall:
    id: str = ""
    name: str = ""
    arguments: str = ""

    def take(self, delta: dict[str, Any]) -> None:
        """A tool call's delta names its id and name whole (once they change) and adds to its arguments."""
        self.id = delta.get("id") or self.id
        function = delta.get("function")
        if isinstance(function, dict):
            self.name = function.get("name") or self.name
            self.arguments += function.get("arguments") or ""

    def as_json(self) -> dict[str, Any]:
        call: dict[str, Any] = {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        if self.id:
            call["id"] = self.id
        return call


@dataclass
class Choice:
    """One choice (one prompt of a completions line) as its chunks built it."""

    index: int
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: dict[int, ToolCall] = field(default_factory=dict)
    logprobs: list[Any] | None = None
    finish_reason: str | None = None

    def take(self, chunk_choice: dict[str, Any], chat: bool) -> None:
        self.finish_reason = chunk_choice.get("finish_reason") or self.finish_reason
        logprobs = chunk_choice.get("logprobs")
        if isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list):
            self.logprobs = [*(self.logprobs or []), *logprobs["content"]]
        if not chat:
            self.text.append(chunk_choice.get("text") or "")
            return
        delta = chunk_choice.get("delta") or {}
        self.text.append(delta.get("content") or "")
        self.reasoning.append(delta.get("reasoning_content") or "")
        for call in delta.get("tool_calls") or ():
            self.tool_calls.setdefault(int(call.get("index", 0)), ToolCall()).take(call)

    def as_json(self, chat: bool) -> dict[str, Any]:
        text = "".join(self.text)
        if not chat:
            return {"text": text, "index": self.index,
                    "logprobs": None if self.logprobs is None else {"content": self.logprobs},
                    "finish_reason": self.finish_reason}
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if any(self.reasoning):
            message["reasoning_content"] = "".join(self.reasoning)
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[index].as_json() for index in sorted(self.tool_calls)]
        choice = {"finish_reason": self.finish_reason, "index": self.index, "message": message}
        if self.logprobs is not None:
            choice["logprobs"] = {"content": self.logprobs}
        return choice


@dataclass
class StreamedReply:
    """The chunks of one request's stream, folded as they come (on the engine's thread): `take` each, then `reply`."""

    chat: bool
    choices: dict[int, Choice] = field(default_factory=dict)
    last: dict[str, Any] = field(default_factory=dict)
    """The last chunk seen: its id, created, model and fingerprint are the reply's."""
    usages: list[dict[str, Any]] = field(default_factory=list)
    """Each finished choice's usage (a stream states one per prompt)."""
    timings: Any = None
    error: dict[str, Any] | None = None
    """An error llama.cpp answered instead of (or in the middle of) the stream: the reply is that error."""

    def take(self, chunk: object) -> None:
        if not isinstance(chunk, dict):
            return  # xllamacpp hands on an empty event as None
        if "error" in chunk or chunk.get("type") == "server_error":
            self.error = chunk
            return
        self.last = chunk
        if isinstance(chunk.get("usage"), dict):
            self.usages.append(chunk["usage"])
        self.timings = chunk.get("timings", self.timings)
        for choice in chunk.get("choices") or ():
            index = int(choice.get("index", 0))
            self.choices.setdefault(index, Choice(index)).take(choice, self.chat)

    def reply(self) -> dict[str, Any]:
        """The unstreamed answer these chunks amount to (llama.cpp's own field order), or the error it gave."""
        if self.error is not None:
            return self.error
        if not self.choices or not self.usages or any(c.finish_reason is None for c in self.choices.values()):
            return {"type": "server_error", "message": "llama.cpp's stream ended before the request finished"}
        reply = {"choices": [self.choices[index].as_json(self.chat) for index in sorted(self.choices)],
                 "created": self.last.get("created"), "model": self.last.get("model"),
                 "system_fingerprint": self.last.get("system_fingerprint"),
                 "object": "chat.completion" if self.chat else "text_completion", "usage": self._usage(),
                 "id": self.last.get("id")}
        if self.timings is not None:
            reply["timings"] = self.timings
        return reply

    def _usage(self) -> dict[str, Any]:
        if len(self.usages) == 1:
            return self.usages[0]
        usage: dict[str, Any] = {name: sum(int(u.get(name) or 0) for u in self.usages) for name in USAGE_COUNTS}
        usage["prompt_tokens_details"] = {"cached_tokens": sum(
            int((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0) for u in self.usages)}
        return usage
