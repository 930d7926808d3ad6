"""Counting prompt tokens of a model served from a Hugging Face checkpoint directory: its `tokenizer.json` and chat
template, rendered as the engines do (`hf_prompts.py`: text parts joined by newlines) and counted without special
tokens (the template writes them)."""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2.meta
import jinja2.sandbox
from tokenizers import Tokenizer

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"


def is_checkpoint(path: Path) -> bool:
    return path.is_dir() and (path / TOKENIZER_FILE).is_file()


def _flat(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(part if isinstance(part, str) else str(part.get("text") or "")
                         for part in content if isinstance(part, str | dict))
    return ""


def _special(config: dict[str, Any], name: str) -> str:
    value = config.get(name)
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


@dataclass(frozen=True)
class Vocabulary:
    n_vocab: int


@dataclass
class HfTokenizer:
    tokenizer: Tokenizer
    template: jinja2.Template
    template_variables: frozenset[str]
    specials: dict[str, str]
    encoding: Vocabulary

    @classmethod
    def from_checkpoint(cls, directory: Path) -> "HfTokenizer":
        tokenizer = Tokenizer.from_file(str(directory / TOKENIZER_FILE))
        config_path = directory / CONFIG_FILE
        config: dict[str, Any] = json.loads(config_path.read_text()) if config_path.is_file() else {}
        template_path = directory / TEMPLATE_FILE
        source = template_path.read_text() if template_path.is_file() else config.get("chat_template")
        if isinstance(source, list):  # named templates: the default one
            source = next((t.get("template") for t in source if t.get("name") == "default"), None)
        if not isinstance(source, str):
            raise ValueError(f"{directory} has no chat template")
        environment = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        environment.globals["raise_exception"] = _raise
        parsed = environment.parse(source)
        specials = {name: _special(config, name) for name in ("bos_token", "eos_token", "pad_token", "unk_token")}
        return cls(tokenizer, environment.from_string(source),
                   frozenset(jinja2.meta.find_undeclared_variables(parsed)), specials,
                   Vocabulary(tokenizer.get_vocab_size(with_added_tokens=True)))

    def render_chat(self, messages: list[dict[str, object]], kwargs: dict[str, object] | None = None) -> str:
        flat = [{**message, "content": _flat(message.get("content"))} for message in messages]
        return str(self.template.render({**self.specials, **(kwargs or {}), "messages": flat,
                                         "add_generation_prompt": True}))

    def count_fast(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def fits(self, text: str, room: int) -> bool:
        return self.count_fast(text) <= room

    def chat_over(self, messages: list[dict[str, object]], room: int,
                  kwargs: dict[str, object] | None = None) -> str | None:
        """None when the chat's prompt is at most `room` tokens; otherwise the rendered prompt."""
        if self.count_chat(messages) <= room:  # no cheaper bound holds for every tokenizer a checkpoint may have
            return None
        rendered = self.render_chat(messages, kwargs)
        return None if self.fits(rendered, room) else rendered

    def plain_chat_over(self, roles: tuple[str, ...], contents: list[str], room: int) -> str | None:
        messages: list[dict[str, object]] = [{"role": role, "content": content}
                                             for role, content in zip(roles, contents, strict=True)]
        return self.chat_over(messages, room)

    def count_many(self, texts: list[str]) -> list[int]:
        return [len(found.ids) for found in self.tokenizer.encode_batch(texts, add_special_tokens=False)]

    def count_chat(self, messages: list[dict[str, object]]) -> int:
        return self.count_fast(self.render_chat(messages))
