"""A model served from a Hugging Face checkpoint directory (TensorRT-LLM) has its prompts counted with the
checkpoint's own tokenizer and chat template, so its lines get the same `context_too_long` check as a GGUF model's
(they once got none)."""

import json
from pathlib import Path

import orjson
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from contracts.catalogue import Catalogue, CatalogueModel
from services.validator.adapters.hf_tokenizer import HfTokenizer
from services.validator.adapters.tokenizer import TokenizerCache
from services.validator.domain import FileValidation

CHAT = "/v1/chat/completions"
TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tools') }}"
            "{% endif %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    """A checkpoint's tokenizer files (no weights): one token per word, `<s>` and the role markers special."""
    words = ["<unk>", "<s>", "<user>", "<system>", "<assistant>", "hello", "there", "say", "hi", "a", "b"]
    tokenizer = Tokenizer(models.WordLevel({word: index for index, word in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(["<s>"])
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": {"content": "<s>"}, "eos_token": "</s>", "chat_template": TEMPLATE}))
    return tmp_path


def test_the_checkpoints_template_and_tokenizer_count_the_prompt(checkpoint: Path) -> None:
    tokenizer = HfTokenizer.from_checkpoint(checkpoint)
    rendered = tokenizer.render_chat([{"role": "user", "content": [{"type": "text", "text": "hello"},
                                                                   {"type": "text", "text": "there"}]}])
    assert rendered == "<s><user> hello\nthere <assistant>"
    # <s> < user > hello there < assistant >: the markers split on punctuation as this tokenizer's pre-tokenizer does
    assert tokenizer.count_chat([{"role": "user", "content": "hello there"}]) == tokenizer.count_fast(
        "<s><user> hello there <assistant>")
    assert tokenizer.encoding.n_vocab == 11 and "bos_token" in tokenizer.template_variables


def test_a_tensorrt_llm_models_line_over_its_context_is_refused(checkpoint: Path) -> None:
    model = CatalogueModel(id="llama", engine="tensorrt_llm", artifact=str(checkpoint), context_length=24,
                           memory_bytes=1, endpoints=[CHAT])
    catalogue = Catalogue(models=[model])
    tokenizers = TokenizerCache()
    assert isinstance(tokenizers.get(model), HfTokenizer)

    def line(content: str, max_tokens: int) -> bytes:
        return orjson.dumps({"custom_id": content[:10], "method": "POST", "url": CHAT, "body": {
            "model": "llama", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}})

    validation = FileValidation(CHAT, catalogue, tokenizers=tokenizers)
    assert validation.feed(1, line("say hi", 4)) == []
    refused = validation.feed(2, line("hello there " * 10, 4))
    assert [issue.code for issue in refused] == ["context_too_long"]
