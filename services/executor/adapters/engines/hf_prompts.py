"""Prompts for engines that read Hugging Face checkpoints (TensorRT-LLM), built as `trtllm-serve` builds them: each
message's content flattened to text (a list of text parts joined by newlines, `null` as empty), the model's own chat
template rendered to text with the generation prompt, and that text later tokenized *without* special tokens (the
template already wrote BOS and the role markers; adding them again gives Llama-3 and Mistral two BOS)."""

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


def chat_prompt(tokenizer: Any, messages: object, template_kwargs: dict[str, Any] | None = None) -> str:
    """The chat template's text for these messages, ending with the assistant's turn (jinja2's `TemplateError` and
    a template's own `raise_exception` propagate: the caller answers them as the line's 400)."""
    return str(tokenizer.apply_chat_template(flat_messages(messages), tokenize=False, add_generation_prompt=True,
                                             **(template_kwargs or {})))
