"""llama.cpp's streamed answer to one request rebuilt as its unstreamed answer (streaming only lets a line be stopped),
and which requests are streamed: logprobs and tool calls cannot be rebuilt, so those run unstreamed, several prompts one
at a time (`one_answer`) so that usage counts every prompt."""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

STREAM_OPTIONS = {"include_usage": True}
"""A chat stream states its usage (and timings) in a last chunk only when asked; a completions stream always does."""
USAGE_COUNTS = ("completion_tokens", "prompt_tokens", "total_tokens")
UNSTREAMED_WHEN = ("logprobs", "top_logprobs", "n_probs", "tools", "functions")
"""A request naming any of these with a value that asks something runs unstreamed (see above)."""


def streamable(request: Mapping[str, object]) -> bool:
    """Whether the answer can be rebuilt from its stream: no logprobs, no tools asked (`tools: []` asks nothing)."""
    return not any(request.get(name) for name in UNSTREAMED_WHEN)


def summed_usage(usages: list[dict[str, Any]]) -> dict[str, Any]:
    """The usage of several prompts' answers as one (llama.cpp's own answer to several prompts states the first's)."""
    if len(usages) == 1:
        return usages[0]
    usage: dict[str, Any] = {name: sum(int(u.get(name) or 0) for u in usages) for name in USAGE_COUNTS}
    usage["prompt_tokens_details"] = {"cached_tokens": sum(
        int((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0) for u in usages)}
    return usage


def one_answer(answers: list[dict[str, Any]]) -> dict[str, Any]:
    """Several prompts' answers as one: each choice under its index, all their usage (or the first error)."""
    for answer in answers:
        if "error" in answer or answer.get("type") == "server_error" or not isinstance(answer.get("usage"), dict):
            return answer
    choices = [{**answer["choices"][0], "index": index} for index, answer in enumerate(answers)]
    return {**answers[-1], "choices": choices, "usage": summed_usage([answer["usage"] for answer in answers])}


@dataclass
class Choice:
    """One choice (one prompt of a completions line) as its chunks built it."""

    index: int
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    finish_reason: str | None = None

    def take(self, chunk_choice: dict[str, Any], chat: bool) -> None:
        self.finish_reason = chunk_choice.get("finish_reason") or self.finish_reason
        if not chat:
            self.text.append(chunk_choice.get("text") or "")
            return
        delta = chunk_choice.get("delta") or {}
        self.text.append(delta.get("content") or "")
        self.reasoning.append(delta.get("reasoning_content") or "")

    def as_json(self, chat: bool) -> dict[str, Any]:
        text = "".join(self.text)
        if not chat:
            return {"text": text, "index": self.index, "logprobs": None, "finish_reason": self.finish_reason}
        message: dict[str, Any] = {"role": "assistant"}
        if any(self.reasoning):
            message["reasoning_content"] = "".join(self.reasoning)
        message["content"] = text
        return {"finish_reason": self.finish_reason, "index": self.index, "message": message}


@dataclass
class StreamedReply:
    """The chunks of one request's stream, folded as they come (on the engine's thread): `take` each, then `reply`."""

    chat: bool
    expected_choices: int = 1
    choices: dict[int, Choice] = field(default_factory=dict)
    last: dict[str, Any] = field(default_factory=dict)
    """The last chunk seen: its id, created, model and fingerprint are the reply's."""
    usages: list[dict[str, Any]] = field(default_factory=list)
    """Each finished choice's usage (a stream states one per prompt)."""
    timings: Any = None
    error: dict[str, Any] | None = None
    """An error llama.cpp answered instead of (or in the middle of) the stream: the reply is that error."""
    seen: int = 0
    """Chunks taken (an exception after the first is the stream's, not the request's)."""

    def take(self, chunk: object) -> None:
        self.seen += 1
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
        """The unstreamed answer these chunks amount to, or the error given; a stream cut short is a server error."""
        if self.error is not None:
            return self.error
        finished = [choice for choice in self.choices.values() if choice.finish_reason is not None]
        if len(finished) != self.expected_choices or len(self.choices) != self.expected_choices or not self.usages:
            return {"type": "server_error", "message": "llama.cpp's stream ended before the request finished"}
        reply = {"choices": [self.choices[index].as_json(self.chat) for index in sorted(self.choices)],
                 "created": self.last.get("created"), "model": self.last.get("model"),
                 "system_fingerprint": self.last.get("system_fingerprint"),
                 "object": "chat.completion" if self.chat else "text_completion", "usage": summed_usage(self.usages),
                 "id": self.last.get("id")}
        if self.timings is not None:
            reply["timings"] = self.timings
        return reply

