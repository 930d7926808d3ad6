"""Counting prompt tokens with the model's own tokenizer and chat template, read from its GGUF file.

The vocabulary and chat template inside the GGUF rebuild the exact byte-level BPE tokenizer the engine uses (as a
tiktoken encoding: token ids follow merge order, so they are the merge ranks), so the validator counts what
llama.cpp will count, without loading the weights.
"""

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

import jinja2.meta
import jinja2.sandbox
import tiktoken

from contracts.catalogue import CatalogueModel
from services.runtime.catalogue import resolve_artifact
from services.validator.adapters.gguf_metadata import read_metadata

log = logging.getLogger(__name__)

CONTROL_TOKEN_TYPE = 3
GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
"""The pre-tokenizer regex of GPT-2-style byte-level BPE (llama.cpp's `gpt2` and `smollm` pre types)."""
SPLITS_BY_PRE_TYPE = {"gpt2": GPT2_SPLIT, "smollm": GPT2_SPLIT}
FALLBACK_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                     "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _byte_decoder() -> dict[str, int]:
    """GPT-2's printable stand-in characters for raw bytes, reversed."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(char): byte for byte, char in zip(printable, chars, strict=True)}


@dataclass(frozen=True)
class ModelTokenizer:
    encoding: tiktoken.Encoding
    template: jinja2.Template
    template_variables: frozenset[str]
    """The variables the chat template reads (what `chat_template_kwargs` may set)."""
    overhead_cache: dict[tuple[str, ...], int] = field(default_factory=dict)

    @classmethod
    def from_gguf(cls, path: Path) -> "ModelTokenizer":
        metadata = read_metadata(path)
        pre_type = metadata.get("tokenizer.ggml.pre", "gpt2")
        if not isinstance(pre_type, str) or pre_type not in SPLITS_BY_PRE_TYPE:
            raise ValueError(f"pre-tokenizer {pre_type!r} is not supported for exact counting")
        tokens, types = metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.token_type"]
        if not isinstance(tokens, list) or not isinstance(types, list):
            raise ValueError("the GGUF file's vocabulary is not a list of tokens and types")
        to_byte = _byte_decoder()
        ranks: dict[bytes, int] = {}
        special: dict[str, int] = {}
        for rank, (token, kind) in enumerate(zip(tokens, types, strict=True)):
            if kind == CONTROL_TOKEN_TYPE:
                special[str(token)] = rank
            else:
                ranks[bytes(to_byte[char] for char in str(token))] = rank
        encoding = tiktoken.Encoding(f"gguf:{path.name}", pat_str=SPLITS_BY_PRE_TYPE[pre_type],
                                     mergeable_ranks=ranks, special_tokens=special)
        source = str(metadata.get("tokenizer.chat_template", FALLBACK_TEMPLATE))
        environment = jinja2.sandbox.ImmutableSandboxedEnvironment()
        variables = frozenset(jinja2.meta.find_undeclared_variables(environment.parse(source)))
        return cls(encoding, environment.from_string(source), variables)

    def count_text(self, text: str) -> int:
        # Special-token text is parsed as the special token, as llama.cpp does with the rendered prompt.
        return len(self.encoding.encode(text, allowed_special="all"))

    def count_many(self, texts: list[str]) -> list[int]:
        """Token counts of many texts at once, on every core (the encoder releases the GIL)."""
        return [len(ids) for ids in self.encoding.encode_batch(texts, allowed_special="all")]

    def render_chat(self, messages: list[dict[str, object]], kwargs: dict[str, object] | None = None) -> str:
        """The prompt the engine builds from `messages` (and the line's `chat_template_kwargs`) with the model's chat
        template."""
        normalised = [{**m, "content": _text_of(m.get("content"))} for m in messages]
        return str(self.template.render({**(kwargs or {}), "messages": normalised, "add_generation_prompt": True}))

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
    """One tokenizer per model artifact (models sharing a GGUF share it), built once: tens of MB each."""

    def __init__(self) -> None:
        self._by_artifact: dict[str, ModelTokenizer | None] = {}
        self._lock = threading.Lock()

    def get(self, model: CatalogueModel) -> ModelTokenizer | None:
        with self._lock:
            if model.artifact not in self._by_artifact:
                self._by_artifact[model.artifact] = self._build(model)
            return self._by_artifact[model.artifact]

    @staticmethod
    def _build(model: CatalogueModel) -> ModelTokenizer | None:
        try:
            return ModelTokenizer.from_gguf(resolve_artifact(model.artifact))
        except (OSError, KeyError, ValueError) as error:
            log.warning("no tokenizer for %s (%s): context checks are skipped for it", model.id, error)
            return None
