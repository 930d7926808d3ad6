"""Counting prompt tokens with the model's own tokenizer and chat template, read from its GGUF file (a checkpoint's
are read by `hf_tokenizer.py`): its vocabulary rebuilds the engine's exact byte-level BPE as a tiktoken encoding (ids
follow merge order, so they are the ranks): the validator counts what llama.cpp will, without loading the weights."""

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import TypeVar

import jinja2.meta
import jinja2.nodes
import jinja2.sandbox
import tiktoken

from contracts.catalogue import CatalogueModel, hub_checkpoint
from services.runtime.storage.catalogue import resolve_artifact
from services.runtime.storage.hub import TOKENIZER_FILES, checkpoint_directory
from services.validator.adapters.chat_template import Skeleton, holds_any, skeleton_parts, template_constants
from services.validator.adapters.gguf_metadata import read_metadata
from services.validator.adapters.hf_tokenizer import HfTokenizer, is_checkpoint
from services.validator.adapters.pair_bound import PairBound

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
    others = [byte for byte in range(256) if byte not in printable]  # each stands as a character past 255
    return {chr(byte): byte for byte in printable} | {chr(256 + n): byte for n, byte in enumerate(others)}


PLAIN_MESSAGE = frozenset({"role", "content"})
"""A message of only these keys is rendered from the skeleton (a template may read any other key it has)."""
PIECES_KEPT = 1 << 18
"""Distinct text pieces whose token counts one tokenizer remembers (then forgotten all at once, and learnt again)."""
ROLE_SEQUENCES_KEPT = 4096
"""Role sequences whose skeleton and overhead one tokenizer remembers (then all forgotten): a tenant's lines can
order roles a new way each, and the tokenizer outlives every batch."""
HEAD_SLACK = 64
"""Characters a counted head takes beyond what its tokens must save (`fits`)."""
COUNT_BITS = (1 << 32) - 1
ENDS_IN_WHITESPACE = 1 << 32
STARTS_WITH_WHITESPACE = 1 << 64
"""Flags a part's remembered value carries above its count: a space next to whitespace makes a run the split breaks."""


class _PieceCounts(dict[str, int]):
    """Token counts of text parts, each counted by the tokenizer on first sight (`prefix` + the part), with flags
    for a part that is empty or starts with whitespace (after the space that precedes it) and one that ends with it."""

    def __init__(self, encoding: tiktoken.Encoding, prefix: str) -> None:
        super().__init__()
        self.encoding, self.prefix = encoding, prefix

    def __missing__(self, part: str) -> int:
        if len(self) >= PIECES_KEPT:
            self.clear()
        value = len(self.encoding.encode(self.prefix + part, allowed_special="all"))
        if part[-1:].isspace():
            value |= ENDS_IN_WHITESPACE
        if self.prefix and (not part or part[0].isspace()):
            value |= STARTS_WITH_WHITESPACE
        self[part] = value
        return value


@dataclass(frozen=True)
class ModelTokenizer:
    encoding: tiktoken.Encoding
    template: jinja2.Template
    template_variables: frozenset[str]
    """The variables the chat template reads (what `chat_template_kwargs` may set)."""
    template_constants: tuple[str, ...] = ()
    """The template's string constants: a content holding one may change what it does, so such a prompt is rendered."""
    cuts_at_spaces: bool = False
    """No special token holds whitespace, so a space after other text always starts a new piece (`fits`)."""
    overhead_cache: dict[tuple[str, ...], int] = field(default_factory=dict)
    skeletons: dict[tuple[str, ...], Skeleton | None] = field(default_factory=dict)
    """Each sequence of roles' skeleton; None: the template must render each prompt of them."""
    first_pieces: dict[str, int] = field(default_factory=dict)
    spaced_pieces: dict[str, int] = field(default_factory=dict)
    constants_by_first: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """`template_constants` by first character (a one-character search is far cheaper than a string's)."""
    missing_bytes: bytes = b""
    """Bytes no token is (SmolLM2 lacks some control and UTF-8 lead bytes): the encoder panics on them."""
    pair_bound: PairBound | None = None
    """A bound on a text's count from its bytes (None: none holds for this vocabulary), tried before counting."""

    def __post_init__(self) -> None:
        by_first: dict[str, list[str]] = {}
        for constant in self.template_constants:
            by_first.setdefault(constant[0], []).append(constant)
        object.__setattr__(self, "constants_by_first", {first: tuple(group) for first, group in by_first.items()})
        object.__setattr__(self, "first_pieces", _PieceCounts(self.encoding, ""))
        object.__setattr__(self, "spaced_pieces", _PieceCounts(self.encoding, " "))

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
        missing = bytes(byte for byte in range(256) if bytes([byte]) not in ranks)
        source = str(metadata.get("tokenizer.chat_template", FALLBACK_TEMPLATE))
        environment = jinja2.sandbox.ImmutableSandboxedEnvironment()
        parsed = environment.parse(source)
        variables = frozenset(jinja2.meta.find_undeclared_variables(parsed))
        cuts_at_spaces = not any(char.isspace() for token in special for char in token)
        return cls(encoding, environment.from_string(source), variables, template_constants(parsed), cuts_at_spaces,
                   missing_bytes=missing, pair_bound=PairBound.of(ranks, special))

    def count_text(self, text: str) -> int:
        if not self._encodable(text):
            return _size(text)
        # Special-token text is parsed as the special token, as llama.cpp does with the rendered prompt.
        return len(self.encoding.encode(text, allowed_special="all"))

    def count_many(self, texts: list[str]) -> list[int]:
        """Token counts of many texts at once, on every core (the encoder releases the GIL)."""
        if not all(map(self._encodable, texts)):
            return [self.count_text(text) for text in texts]
        return [len(ids) for ids in self.encoding.encode_batch(texts, allowed_special="all")]

    def _encodable(self, text: str) -> bool:
        """Whether every byte of `text` is a token. One that is not (a hostile control byte) is counted as its UTF-8
        size: no token covers less than a byte, so the line is judged on a bound rather than crash the validator."""
        missing = self.missing_bytes
        if not missing:
            return True
        data = text.encode("utf-8", "surrogatepass")
        return len(data.translate(None, missing)) == len(data)

    def count_fast(self, text: str) -> int:
        """`count_text`, from remembered counts of the text's parts when no whitespace run of it holds a space.

        GPT-2's pre-tokenizer starts a piece at every space followed by non-whitespace, and BPE never merges across
        pieces, so it is the sum of its parts' counts (split before each space); a text with a run like `"  "` or
        `" \\n"` (seen from its parts' flags) is counted whole."""
        if not self._encodable(text):
            return _size(text)  # what `count_text` counts such a text
        return self._count_parts(text)

    def _count_parts(self, text: str) -> int:
        """`count_fast` of an encodable text."""
        parts = text.split(" ")
        if len(parts) == 1:
            return len(self.encoding.encode(text, allowed_special="all"))
        spaced = self.spaced_pieces
        seen: Callable[[str], int | None] = spaced.get
        try:  # every part seen before, as nearly always: plain look-ups (an unseen one is None, which sum refuses)
            total = self.first_pieces[parts[0]] + sum(map(seen, islice(parts, 1, None)))  # type: ignore[arg-type]
        except TypeError:
            total = self.first_pieces[parts[0]] + sum(map(spaced.__getitem__, islice(parts, 1, None)))
        ends = (total >> 32) & COUNT_BITS  # parts ending in whitespace; only the last may (no space follows it)
        if total >= STARTS_WITH_WHITESPACE or ends > (spaced[parts[-1]] >> 32) & 1:
            return len(self.encoding.encode(text, allowed_special="all"))
        return total & COUNT_BITS

    def fits(self, text: str, room: int) -> bool:
        """Whether `text` is at most `room` tokens, counting no more of it than that takes.

        A token covers a byte at least, so a text of at most `room` bytes fits. Past that, it is cut at spaces after
        non-whitespace (a new piece starts there, and no special token holds a space): the parts' counts add up, so
        the head's count plus the tail's bytes bound the whole. The head grows until the bound settles it."""
        size = _size(text)
        if size <= room:
            return True
        if not self._encodable(text):
            return False  # counted as its size (`count_text`), which is more than `room`
        return (self.pair_bound is not None and self.pair_bound(text.encode()) <= room) or self._head_fits(
            text, size, room)

    def _head_fits(self, text: str, size: int, room: int) -> bool:
        """`fits` of an encodable text of `size` bytes, more than `room`, from its head counted."""
        counted = counted_bytes = start = 0
        while self.cuts_at_spaces:
            cut = text.find(" ", start + (counted + size - counted_bytes - room) * 5 // 4 + HEAD_SLACK)
            while cut > 0 and text[cut - 1].isspace():
                cut = text.find(" ", cut + 1)
            if cut <= 0:
                break
            part = text[start:cut]
            counted, counted_bytes, start = counted + self._count_parts(part), counted_bytes + _size(part), cut
            if counted + size - counted_bytes <= room:
                return True
        return counted + self._count_parts(text[start:]) <= room

    def render_chat(self, messages: list[dict[str, object]], kwargs: dict[str, object] | None = None) -> str:
        """The prompt the engine builds from `messages` (and the line's `chat_template_kwargs`) with the model's chat
        template; spliced into the template's cached skeleton when it provably renders contents as they are."""
        contents = [_text_of(m.get("content")) for m in messages]
        skeleton = self._skeleton_of(_roles(messages), "".join(contents)) if _plain(messages, kwargs) else None
        return skeleton.splice(contents) if skeleton is not None else self._render(messages, contents, kwargs)

    def _skeleton_of(self, roles: tuple[str, ...], joined: str) -> Skeleton | None:
        """The skeleton to splice contents (`joined`) of messages of `roles` into; None where they hold a constant of
        the template (or two make one, which costs only a rendering), or it must render them."""
        if holds_any(joined, self.constants_by_first):
            return None
        try:
            return self.skeletons[roles]
        except KeyError:  # (or forgotten by another thread's `_bounded` since)
            skeleton = _bounded(self.skeletons)[roles] = self._skeleton(roles)
            return skeleton

    def chat_over(self, messages: list[dict[str, object]], room: int,
                  kwargs: dict[str, object] | None = None) -> str | None:
        """None when the chat's prompt is at most `room` tokens (`chat_bound`, then the rendered prompt's `fits`);
        otherwise the rendered prompt, to count exactly. Each message's role and text is read once."""
        contents = [_text_of(m.get("content")) for m in messages]
        return self._over(messages, _plain(messages, kwargs), _roles(messages), contents, room, kwargs)

    def plain_chat_over(self, roles: tuple[str, ...], contents: list[str], room: int) -> str | None:
        """`chat_over` of messages of a string role and content each, given as those: bounded from the skeleton's
        pair-bound weights and the contents' own (`PairBound.spoilt` adds up over parts), spliced only if unsettled."""
        overhead, bound = self.overhead_cache.get(roles), self.pair_bound
        if overhead is None or bound is None:
            return self._over(None, True, roles, contents, room, None)
        joined = "".join(contents)
        data = joined.encode("utf-8", "surrogatepass")
        if overhead + len(data) <= room:
            return None
        skeleton = self._skeleton_of(roles, joined)
        if skeleton is None:
            return self._over(None, True, roles, contents, room, None)
        size, spoilt = skeleton.size + len(data), bound.spoilt(data)  # spoilt None: a byte the vocabulary lacks
        if size <= room or (spoilt is not None and bound.within(size, skeleton.spoilt + spoilt) <= room):
            return None
        rendered = skeleton.splice(contents)
        return None if spoilt is not None and self._head_fits(rendered, size, room) else rendered

    def _over(self, messages: list[dict[str, object]] | None, plain: bool, roles: tuple[str, ...],
              contents: list[str], room: int, kwargs: dict[str, object] | None) -> str | None:
        """`chat_over`; `plain`: `_plain(messages, kwargs)`; `messages` None: they are their roles and contents."""
        overhead = self.overhead_cache.get(roles)
        if overhead is None:
            overhead = self.chat_bound([{"role": role, "content": ""} for role in roles])
        if overhead + sum(map(_size, contents)) <= room:
            return None
        skeleton = self._skeleton_of(roles, "".join(contents)) if plain else None
        if skeleton is not None:
            rendered = skeleton.splice(contents)
        else:
            if messages is None:
                messages = [{"role": role, "content": content} for role, content in zip(roles, contents, strict=True)]
            rendered = self._render(messages, contents, kwargs)
        return None if self.fits(rendered, room) else rendered

    def _render(self, messages: list[dict[str, object]], contents: list[str], kwargs: dict[str, object] | None) -> str:
        normalised = [{**m, "content": content} for m, content in zip(messages, contents, strict=True)]
        return str(self.template.render({**(kwargs or {}), "messages": normalised, "add_generation_prompt": True}))

    def _skeleton(self, roles: tuple[str, ...]) -> Skeleton | None:
        """`skeleton_parts` of the template and `roles`, unless a byte of it is not in the vocabulary: such a
        skeleton is rendered with each prompt, which is then looked at whole."""
        parts = skeleton_parts(self.template, roles)
        text = "".join(parts) if parts is not None else ""
        if parts is None or not self._encodable(text):
            return None
        data = text.encode()
        return Skeleton(parts, len(data), (self.pair_bound.spoilt(data) or 0) if self.pair_bound else 0)

    def count_chat(self, messages: list[dict[str, object]]) -> int:
        return self.count_text(self.render_chat(messages))

    def chat_bound(self, messages: list[dict[str, object]]) -> int:
        """A cheap upper bound on `count_chat`: a byte-level BPE token covers at least one byte, so the
        template's own bytes (cached per sequence of roles) plus the contents' bytes bound the count."""
        roles = _roles(messages)
        overhead = self.overhead_cache.get(roles)
        if overhead is None:
            empty: list[dict[str, object]] = [{"role": role, "content": ""} for role in roles]
            overhead = _bounded(self.overhead_cache)[roles] = len(self.render_chat(empty).encode())
        return overhead + sum(_size(_text_of(m.get("content"))) for m in messages)


PromptTokenizer = ModelTokenizer | HfTokenizer
"""What the validator's rules count with: a GGUF's tokenizer or a checkpoint's."""
V = TypeVar("V")


def _bounded(cache: dict[tuple[str, ...], V]) -> dict[tuple[str, ...], V]:
    """`cache`, emptied first if it holds `ROLE_SEQUENCES_KEPT` sequences already."""
    if len(cache) >= ROLE_SEQUENCES_KEPT:
        cache.clear()
    return cache


def _roles(messages: list[dict[str, object]]) -> tuple[str, ...]:
    return tuple([str(m.get("role", "")) for m in messages])


def _plain(messages: list[dict[str, object]], kwargs: dict[str, object] | None) -> bool:
    """The messages are only their roles and contents to the template (which then may be spliced)."""
    return not kwargs and all(m.keys() <= PLAIN_MESSAGE for m in messages)


def _size(text: str) -> int:
    """Bytes of `text` in UTF-8 (an ASCII text's length, without encoding it)."""
    return len(text) if text.isascii() else len(text.encode())


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
        self._by_artifact: dict[str, PromptTokenizer | None] = {}
        self._lock = threading.Lock()

    def get(self, model: CatalogueModel) -> PromptTokenizer | None:
        built = self._by_artifact.get(model.artifact, self)  # built already, as nearly always: no lock needed
        if built is not self:
            return built  # type: ignore[return-value]
        with self._lock:
            if model.artifact not in self._by_artifact:
                self._by_artifact[model.artifact] = self._build(model)
            return self._by_artifact[model.artifact]

    @staticmethod
    def _build(model: CatalogueModel) -> PromptTokenizer | None:
        try:
            checkpoint = hub_checkpoint(model.artifact)
            if checkpoint is not None:  # its tokenizer files alone, from huggingface_hub's cache or the hub
                return HfTokenizer.from_checkpoint(checkpoint_directory(checkpoint, only=TOKENIZER_FILES))
            artifact = resolve_artifact(model.artifact)
            if is_checkpoint(artifact):
                return HfTokenizer.from_checkpoint(artifact)
            return ModelTokenizer.from_gguf(artifact)
        except (OSError, KeyError, ValueError, jinja2.TemplateError) as error:
            log.warning("no tokenizer for %s (%s): context checks are skipped for it", model.id, error)
            return None
