"""A whole Hugging Face checkpoint named `hf://<owner>/<repo>@<revision>` (what TensorRT-LLM and transformers load):
the catalogue reads it, an executor gets its snapshot directory from huggingface_hub's cache (offline for a revision
held there), and the validator counts prompts with its tokenizer files, so its lines get `context_too_long` too."""

import json
from pathlib import Path

import huggingface_hub.constants
import orjson
import pytest
from pydantic import ValidationError
from tokenizers import Tokenizer, models, pre_tokenizers

from contracts.catalogue import Catalogue, CatalogueModel, HubCheckpoint, hub_artifact, hub_checkpoint
from services.executor.adapters.artifacts import ArtifactResolver, ArtifactUnavailable
from services.validator.adapters.hf_tokenizer import HfTokenizer
from services.validator.adapters.tokenizer import TokenizerCache
from services.validator.domain import FileValidation

CHAT = "/v1/chat/completions"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
ARTIFACT = f"hf://acme/tiny-chat@{COMMIT}"
TEMPLATE = "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}<assistant>"


def model(artifact: str = ARTIFACT, engine: str = "tensorrt_llm", **fields: object) -> CatalogueModel:
    return CatalogueModel.model_validate({"id": "tiny", "engine": engine, "artifact": artifact, "context_length": 16,
                                          "memory_bytes": 1, "endpoints": [CHAT], **fields})


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """huggingface_hub's cache holding the checkpoint at COMMIT, and no hub to ask."""
    cache = tmp_path / "hub"
    snapshot = cache / "models--acme--tiny-chat" / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    words = ["<unk>", "<user>", "<assistant>", "hello", "there", "hi"]
    tokenizer = Tokenizer(models.WordLevel({word: index for index, word in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(snapshot / "tokenizer.json"))
    (snapshot / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    (snapshot / "config.json").write_text("{}")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return cache


def test_a_checkpoint_repo_is_named_by_its_repo_and_pinned_revision() -> None:
    assert hub_checkpoint(ARTIFACT) == HubCheckpoint("acme/tiny-chat", COMMIT)
    assert hub_artifact(ARTIFACT) is None and hub_checkpoint(f"{ARTIFACT}/model.gguf") is None
    assert model().served_revision == COMMIT


def test_llama_cpp_needs_a_file_and_a_checkpoint_is_pinned_by_its_revision_alone() -> None:
    with pytest.raises(ValidationError, match=r"llama\.cpp loads one GGUF file"):
        model(engine="llamacpp")
    with pytest.raises(ValidationError, match="pinned by its revision"):
        model(sha256="a" * 64)


async def test_an_executor_loads_the_snapshot_directory_from_the_cache(hub_cache: Path, tmp_path: Path) -> None:
    resolver = ArtifactResolver(tmp_path / "models", hub_cache_dir=hub_cache)
    directory = await resolver.local_path(model())
    assert directory.is_dir() and (directory / "config.json").is_file()
    with pytest.raises(ArtifactUnavailable, match="not in the Hugging Face cache"):
        await resolver.local_path(model(f"hf://acme/other@{COMMIT}"))


def test_the_validator_counts_prompts_with_the_checkpoints_tokenizer(hub_cache: Path) -> None:
    served = model()
    tokenizers = TokenizerCache()
    assert isinstance(tokenizers.get(served), HfTokenizer)

    def line(custom_id: str, content: str) -> bytes:
        return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": CHAT, "body": {
            "model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 2}})

    validation = FileValidation(CHAT, Catalogue(models=[served]), tokenizers=tokenizers)
    assert validation.feed(1, line("a", "hello there")) == []
    assert [issue.code for issue in validation.feed(2, line("b", "hello there " * 6))] == ["context_too_long"]
