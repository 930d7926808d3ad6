"""Prompts and answers for engines that read Hugging Face checkpoints (TensorRT-LLM, transformers), built as
`trtllm-serve` builds them: content flattened to text, the model's chat template rendered to text, and that text
tokenized *without* special tokens (the template wrote BOS already; adding it again gives Llama-3 two)."""

import secrets
import time
from typing import Any

from services.executor.adapters.engines.responses import UnmappableRequest

TEXT_PARTS = ("text", "input_text", "output_text")


def flat_content(content: object) -> str:
    """A message's content as the template reads it."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type") in TEXT_PARTS:
                texts.append(str(part.get("text") or ""))
            else:
                raise UnmappableRequest(f"content part {str(part)[:80]} is not text; this model reads text only")
        return "\n".join(texts)
    raise UnmappableRequest("content must be a string, a list of text parts or null")


def flat_messages(messages: object) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise UnmappableRequest("messages must be a non-empty list")
    flat = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise UnmappableRequest("each message needs a role")
        flat.append({**message, "content": flat_content(message.get("content"))})
    return flat


def prompt_text(tokenizer: Any, endpoint: str, request: dict[str, Any]) -> str:
    """A completion's prompt, or the chat template's text ending with the assistant's turn (its errors propagate)."""
    if endpoint == "/v1/completions":
        prompt = request.get("prompt")
        if not isinstance(prompt, str):
            raise UnmappableRequest("prompt must be a string")
        return prompt
    kwargs = request.get("chat_template_kwargs")
    messages = flat_messages(request.get("messages"))
    return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                             **(kwargs if isinstance(kwargs, dict) else {})))


def text_choice(index: int, reason: str, text: str, chat: bool) -> dict[str, Any]:
    """One choice of a chat or text completion, keyed as the llama.cpp engine's (bench/gpu_smoke.py compares them)."""
    if chat:
        return {"index": index, "finish_reason": reason, "message": {"role": "assistant", "content": text}}
    return {"index": index, "finish_reason": reason, "text": text, "logprobs": None}


def completion(chat: bool, model_id: str, choices: list[dict[str, Any]], prompt_tokens: int, generated: int,
               cached: int, fingerprint: str) -> dict[str, Any]:
    """The OpenAI chat or text completion these choices and token counts amount to, under a fresh id."""
    return {
        "id": f"{'chatcmpl-' if chat else 'cmpl-'}{secrets.token_hex(12)}",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()), "model": model_id, "choices": choices, "system_fingerprint": fingerprint,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": generated,
                  "total_tokens": prompt_tokens + generated, "prompt_tokens_details": {"cached_tokens": cached}},
    }
