"""The Responses API on top of an engine's chat: a Responses request as a chat request, a chat completion
as a Response object. Pure mapping, shared by every engine."""

from typing import Any

from contracts.engines import LOGPROBS_INCLUDE
from contracts.ids import derived_id

SAMPLING = ("temperature", "top_p", "seed", "stop")
"""Parameters that mean the same in both APIs."""


class UnmappableRequest(ValueError):
    """A Responses request this mapping cannot express as a chat request (the line's fault: a 400)."""


def _text_of(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text"):
                raise UnmappableRequest(f"content part {part!r} is not text")
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise UnmappableRequest("content must be a string or a list of text parts")


def _messages_of(items: object) -> list[dict[str, str]]:
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise UnmappableRequest("input must be a string or a list of messages")
    messages = []
    for item in items:
        if not isinstance(item, dict) or item.get("type", "message") != "message" or "role" not in item:
            raise UnmappableRequest(f"input item {item!r} is not a message")
        role = "system" if item["role"] == "developer" else str(item["role"])
        messages.append({"role": role, "content": _text_of(item.get("content"))})
    return messages


def chat_request(body: dict[str, Any]) -> dict[str, Any]:
    """The chat request that computes what a Responses request asks for."""
    messages = _messages_of(body.get("input"))
    if isinstance(body.get("instructions"), str):
        messages.insert(0, {"role": "system", "content": body["instructions"]})
    request: dict[str, Any] = {"messages": messages}
    if body.get("max_output_tokens") is not None:
        request["max_tokens"] = body["max_output_tokens"]
    for key in SAMPLING:
        if body.get(key) is not None:
            request[key] = body[key]
    if wants_logprobs(body):  # chat states them only when asked (`top_logprobs` alone is refused there)
        request["logprobs"] = True
        request["top_logprobs"] = body.get("top_logprobs") or 0
    text_format = body.get("text", {}).get("format") if isinstance(body.get("text"), dict) else None
    if isinstance(text_format, dict) and text_format.get("type") == "json_object":
        request["response_format"] = {"type": "json_object"}
    elif isinstance(text_format, dict) and text_format.get("type") == "json_schema":
        schema = {key: value for key, value in text_format.items() if key != "type"}
        request["response_format"] = {"type": "json_schema", "json_schema": schema}
    return request


def wants_logprobs(body: dict[str, Any]) -> bool:
    """Whether a Responses request asks for the output's log probabilities: by `include`, or by asking for the
    `top_logprobs` most likely tokens at each position."""
    include = body.get("include")
    top = body.get("top_logprobs")
    return (isinstance(include, list) and LOGPROBS_INCLUDE in include) or (
        isinstance(top, int) and not isinstance(top, bool) and top > 0)


def _logprobs_of(choice: dict[str, Any]) -> list[dict[str, Any]]:
    """A chat choice's token log probabilities as a Response's output text states them."""
    stated = choice.get("logprobs")
    content = stated.get("content") if isinstance(stated, dict) else None
    if not isinstance(content, list):
        return []

    def token(entry: dict[str, Any]) -> dict[str, Any]:
        return {"token": entry.get("token", ""), "logprob": entry.get("logprob", 0.0),
                "bytes": entry.get("bytes") or []}

    return [{**token(entry), "top_logprobs": [token(top) for top in entry.get("top_logprobs") or []
                                              if isinstance(top, dict)]}
            for entry in content if isinstance(entry, dict)]


def response_body(completion: dict[str, Any], model: str, request: dict[str, Any] | None = None) -> dict[str, Any]:
    """The OpenAI Response object a chat completion amounts to, stating the settings `request` (the line) ran with
    as OpenAI's does (every field its schema requires: no tools ran, none were called)."""
    asked = request or {}
    choice = (completion.get("choices") or [{}])[0]
    text = (choice.get("message") or {}).get("content") or ""
    usage = completion.get("usage") or {}
    prompt, generated = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0))
    source_id = str(completion.get("id", ""))
    truncated = choice.get("finish_reason") == "length"
    return {
        "id": derived_id("resp_", source_id),
        "object": "response",
        "created_at": completion.get("created", 0),
        "status": "incomplete" if truncated else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if truncated else None,
        "model": model,
        "error": None,
        "instructions": asked.get("instructions") if isinstance(asked.get("instructions"), str) else None,
        "metadata": asked.get("metadata") if isinstance(asked.get("metadata"), dict) else {},
        "max_output_tokens": asked.get("max_output_tokens"),
        "temperature": asked.get("temperature", 1.0),
        "top_p": asked.get("top_p", 1.0),
        "top_logprobs": asked.get("top_logprobs") or 0,
        "parallel_tool_calls": asked.get("parallel_tool_calls", True) is not False,
        "tool_choice": "auto",
        "tools": [],
        "text": asked.get("text") if isinstance(asked.get("text"), dict) else {"format": {"type": "text"}},
        "output": [{
            "type": "message", "id": derived_id("msg_", source_id), "role": "assistant",
            "status": "incomplete" if truncated else "completed",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": _logprobs_of(choice)}],
        }],
        "usage": {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": generated, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + generated,
        },
    }
