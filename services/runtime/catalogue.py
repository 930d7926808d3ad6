"""Loading the model catalogue file and resolving artifacts that live inside installed packages."""

import importlib.resources
import importlib.util
from pathlib import Path

from contracts.catalogue import Catalogue

DEFAULT_CATALOGUE = "catalogue.toml"


def load_catalogue(path: Path | None) -> Catalogue:
    if path is None:
        text = importlib.resources.files("infra").joinpath(DEFAULT_CATALOGUE).read_text()
    else:
        text = path.read_text()
    return Catalogue.from_toml(text)


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
