"""Counting prompt tokens with the model's own tokenizer and chat template, read from its GGUF file.

The vocabulary, merges and chat template inside the GGUF rebuild the exact byte-level BPE tokenizer the engine
uses, so the validator counts what llama.cpp will count, without loading the weights.
"""

import gc
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

import jinja2.sandbox
from gguf import GGUFReader
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from contracts.catalogue import CatalogueModel
from services.runtime.catalogue import resolve_artifact

log = logging.getLogger(__name__)

CONTROL_TOKEN_TYPE = 3
FALLBACK_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                     "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _strings(reader: GGUFReader, key: str) -> list[str]:
    field = reader.fields[key]
    return [bytes(field.parts[index]).decode() for index in field.data]


@dataclass(frozen=True)
class ModelTokenizer:
    tokenizer: Tokenizer
    template: jinja2.Template
    overhead_cache: dict[tuple[str, ...], int] = field(default_factory=dict)

    @classmethod
    def from_gguf(cls, path: Path) -> "ModelTokenizer":
        reader = GGUFReader(path)
        tokens = _strings(reader, "tokenizer.ggml.tokens")
        merges = [(left, right) for left, _, right in
                  (merge.partition(" ") for merge in _strings(reader, "tokenizer.ggml.merges"))]
        types_field = reader.fields["tokenizer.ggml.token_type"]
        types = [int(types_field.parts[index][0]) for index in types_field.data]
        tokenizer = Tokenizer(models.BPE({token: i for i, token in enumerate(tokens)}, merges))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tokenizer.decoder = decoders.ByteLevel()
        tokenizer.add_special_tokens([t for t, kind in zip(tokens, types, strict=True) if kind == CONTROL_TOKEN_TYPE])
        source = (_strings(reader, "tokenizer.chat_template")[0] if "tokenizer.chat_template" in reader.fields
                  else FALLBACK_TEMPLATE)
        template = jinja2.sandbox.ImmutableSandboxedEnvironment().from_string(source)
        del reader, types_field  # release the memory-mapped weights at once: only the vocabulary is kept
        gc.collect()
        return cls(tokenizer, template)

    def count_text(self, text: str) -> int:
        return len(self.tokenizer.encode(text).ids)

    def count_many(self, texts: list[str]) -> list[int]:
        """Token counts of many texts at once, on every core (the tokenizer releases the GIL)."""
        return [len(encoding) for encoding in self.tokenizer.encode_batch_fast(texts)]

    def render_chat(self, messages: list[dict[str, object]]) -> str:
        """The prompt the engine builds from `messages` with the model's chat template."""
        normalised = [{**m, "content": _text_of(m.get("content"))} for m in messages]
        return str(self.template.render(messages=normalised, add_generation_prompt=True))

    def count_chat(self, messages: list[dict[str, object]]) -> int:
        return self.count_text(self.render_chat(messages))

    def chat_bound(self, messages: list[dict[str, object]]) -> int:
        """A cheap upper bound on `count_chat`: a byte-level BPE token covers at least one byte, so the
        template's own bytes (cached per sequence of roles) plus the contents' bytes bound the count."""
        roles = tuple(str(m.get("role", "")) for m in messages)
        overhead = self.overhead_cache.get(roles)
        if overhead is None:
            empty: list[dict[str, object]] = [{"role": role, "content": ""} for role in roles]
            overhead = self.overhead_cache[roles] = len(self.render_chat(empty).encode())
        return overhead + sum(len(_text_of(m.get("content")).encode()) for m in messages)


def _text_of(content: object) -> str:
    """Text of a message's content: a string, or the text parts of a content list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


class TokenizerCache:
    """One tokenizer per catalogue model, built on first use (a GGUF read takes a couple of seconds)."""

    def __init__(self) -> None:
        self._by_model: dict[str, ModelTokenizer | None] = {}
        self._lock = threading.Lock()

    def get(self, model: CatalogueModel) -> ModelTokenizer | None:
        with self._lock:
            if model.id not in self._by_model:
                self._by_model[model.id] = self._build(model)
            return self._by_model[model.id]

    @staticmethod
    def _build(model: CatalogueModel) -> ModelTokenizer | None:
        try:
            return ModelTokenizer.from_gguf(resolve_artifact(model.artifact))
        except (OSError, KeyError, ValueError) as error:
            log.warning("no tokenizer for %s (%s): context checks are skipped for it", model.id, error)
            return None
