"""What the validator's rules ask of a model's tokenizer: a GGUF's (`tokenizer.ModelTokenizer`) or a checkpoint's
(`hf_tokenizer.HfTokenizer`)."""

from typing import Protocol


class Vocabulary(Protocol):
    @property
    def n_vocab(self) -> int: ...


class PromptTokenizer(Protocol):
    """What the rules ask of a model's tokenizer: a GGUF's (`ModelTokenizer`) or a checkpoint's (`HfTokenizer`)."""

    @property
    def encoding(self) -> Vocabulary: ...

    @property
    def template_variables(self) -> frozenset[str]: ...

    def count_fast(self, text: str) -> int: ...

    def count_many(self, texts: list[str]) -> list[int]: ...

    def fits(self, text: str, room: int) -> bool: ...

    def chat_over(self, messages: list[dict[str, object]], room: int,
                  kwargs: dict[str, object] | None = None) -> str | None: ...

    def plain_chat_over(self, roles: tuple[str, ...], contents: list[str], room: int) -> str | None: ...

    def count_chat(self, messages: list[dict[str, object]]) -> int: ...
