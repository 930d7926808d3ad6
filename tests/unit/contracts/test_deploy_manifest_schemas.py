"""The deployment files are what their tools accept: the compose file against the Compose Specification's schema, every
Kubernetes manifest against the Kubernetes API's own schemas (strict: no unknown field), checked offline since no
container engine or cluster runs here."""

import json
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[3] / "infra" / "deploy"
KUBERNETES_VERSION = "1.30.0"
"""The Kubernetes API version the manifests are checked against."""
NOT_API_OBJECTS = frozenset({"Kustomization"})
"""Files kubectl reads itself (`kubectl apply -k`), not objects of the API."""


def compose_schema() -> dict[str, Any]:
    schema = resources.files("check_jsonschema.builtin_schemas.vendor").joinpath("compose-spec.json")
    return dict(json.loads(schema.read_text()))


def kubernetes_objects() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document and document.get("kind") not in NOT_API_OBJECTS:
                found.append((f"{path.name}:{document['kind']}/{document['metadata']['name']}", document))
    return found


def test_the_compose_file_follows_the_compose_specification() -> None:
    compose = yaml.safe_load((DEPLOY / "compose" / "compose.yaml").read_text())
    jsonschema.validate(compose, compose_schema())


@pytest.mark.parametrize(("name", "manifest"), kubernetes_objects(), ids=lambda value: value if isinstance(value, str)
                         else "")
def test_every_kubernetes_object_is_valid_against_the_api_schema(name: str, manifest: dict[str, Any]) -> None:
    kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
