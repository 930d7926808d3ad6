"""Whole Hugging Face checkpoints (`hf://<owner>/<repo>@<revision>`) as local directories, through huggingface_hub's
own cache: it answers offline for a revision it holds (a commit hash is found without asking the hub), and fetches
into it when the hub answers. Executors take the whole checkpoint; the validator only its tokenizer files."""

from pathlib import Path

from huggingface_hub import snapshot_download

from contracts.catalogue import HubCheckpoint

TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]
"""What the validator counts prompt tokens with (services/validator/adapters/hf_tokenizer.py)."""
CHECKPOINT_FILES = ["*.json", "*.safetensors", "*.jinja", "*.model", "*.txt", "*.tiktoken"]
"""What an engine loads of a checkpoint repo: config, safetensors weights and index, tokenizer and chat template
(not the `.bin`/`.pth`/`.gguf`/ONNX copies many repos also hold, tens of GB of them)."""


class CheckpointUnavailable(OSError):
    """Neither huggingface_hub's cache nor the hub has the checkpoint at that revision."""


def checkpoint_directory(checkpoint: HubCheckpoint, cache_dir: Path | None = None,
                         only: list[str] | None = None) -> Path:
    """The checkpoint's snapshot directory, with `only` these files (else what engines load of it); blocking."""
    try:
        return Path(snapshot_download(checkpoint.repo, revision=checkpoint.revision, cache_dir=cache_dir,
                                      allow_patterns=only or CHECKPOINT_FILES))
    except Exception as error:  # the hub's and httpx's errors are not all OSErrors
        raise CheckpointUnavailable(
            f"hf://{checkpoint.repo}@{checkpoint.revision}: not in the Hugging Face cache, and the hub did not serve "
            f"it ({type(error).__name__}: {error})") from error
