"""A successful completion in OpenAI's exact shape, whatever engine computed it: every field OpenAI's schema requires
is there (a chat choice's `logprobs` and its message's `refusal`, null when there are none), and a text completion's
id is a `cmpl-` one (llama.cpp names every completion `chatcmpl-…`)."""

from typing import Any

CHAT_ID, TEXT_ID = "chatcmpl-", "cmpl-"


def openai_shaped(endpoint: str, completion: dict[str, Any]) -> dict[str, Any]:
    """`completion` (a chat or text completion) with OpenAI's required fields filled; the engine's own ones kept."""
    choices = [dict(choice) if isinstance(choice, dict) else choice for choice in completion.get("choices") or ()]
    for choice in choices:
        if isinstance(choice, dict):
            choice.setdefault("logprobs", None)
            if isinstance(choice.get("message"), dict):
                choice["message"] = {**choice["message"], "refusal": choice["message"].get("refusal")}
    shaped = {**completion, "choices": choices} if "choices" in completion else dict(completion)
    completion_id = shaped.get("id")
    if endpoint == "/v1/completions" and isinstance(completion_id, str) and completion_id.startswith(CHAT_ID):
        shaped["id"] = TEXT_ID + completion_id[len(CHAT_ID):]
    return shaped
