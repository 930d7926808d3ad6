"""The deployment material (infra/deploy/, docs/deployment.md) names only settings the services read, and gives each
service the secrets its job needs and no others, as the embedded stack does (`infra/process_env.SERVICE_NEEDS`)."""

import importlib
import re
from pathlib import Path

import pytest
import yaml
from pydantic_settings import BaseSettings

from infra.process_env import SERVICE_NEEDS, Need

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "infra" / "deploy"
SETTINGS_MODULES = ("services.runtime.process.settings", *(f"services.{name}.settings" for name in SERVICE_NEEDS))
NAMED = re.compile(r"\b(SHESHNAG_[A-Z0-9_]*[A-Z0-9])(_\*|_…)?")
"""A variable, or a family of them written `SHESHNAG_LEDGER_POSTGRES_*` (or `_…`)."""


def settings_variables() -> set[str]:
    """`<env prefix><FIELD>` of every settings class the services read (the nested connection is its own class)."""
    names = set()
    for module_name in SETTINGS_MODULES:
        module = importlib.import_module(module_name)
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, BaseSettings) and value.__module__ == module_name:
                prefix = value.model_config.get("env_prefix", "")
                names |= {f"{prefix}{field}".upper() for field, info in value.model_fields.items()
                          if not (isinstance(info.annotation, type) and issubclass(info.annotation, BaseSettings))}
    return names


def deployment_files() -> list[Path]:
    return sorted([path for path in DEPLOY.rglob("*") if path.is_file() and "secrets" not in path.parts]
                  + [ROOT / "docs" / "deployment.md"])


def test_the_settings_are_read_from_every_service() -> None:
    names = settings_variables()
    assert {"SHESHNAG_NATS_URL", "SHESHNAG_GATEWAY_HOST", "SHESHNAG_EXECUTOR_WORKER_KEY",
            "SHESHNAG_SCHEDULER_OBJECT_URL_ENDPOINT", "SHESHNAG_LEDGER_POSTGRES_PASSWORD",
            "SHESHNAG_VALIDATOR_MAX_LINES"} <= names
    assert not any(name.endswith("_CONNECTION") for name in names)


@pytest.mark.parametrize("path", deployment_files(), ids=lambda path: str(path.relative_to(ROOT)))
def test_every_sheshnag_variable_the_deployment_names_is_a_real_setting(path: Path) -> None:
    settings = settings_variables()
    unknown = {name + family for name, family in NAMED.findall(path.read_text())
               if (name not in settings if not family else not any(s.startswith(name + "_") for s in settings))}
    assert not unknown, f"{path.name} names variables no service reads: {sorted(unknown)}"


SECRET_FILES: dict[str, Need] = {"core.env": "core_nats", "s3.env": "s3", "callout.env": "callout",
                                 "executor.env": "worker_key"}
SECRETS: dict[str, Need] = {"sheshnag-core": "core_nats", "sheshnag-s3": "s3", "sheshnag-callout": "callout",
                            "sheshnag-executor": "worker_key"}


def test_each_compose_service_gets_the_secrets_its_job_needs_and_no_others() -> None:
    services = yaml.safe_load((DEPLOY / "compose" / "compose.yaml").read_text())["services"]
    for name, needs in SERVICE_NEEDS.items():
        files = [Path(file).name for file in services[name].get("env_file", [])]
        assert {SECRET_FILES[file] for file in files if file in SECRET_FILES} == needs, name
    executor_env = services["executor"]["environment"]
    assert "@" not in executor_env["SHESHNAG_NATS_URL"] and not any("S3" in key for key in executor_env)


def test_each_kubernetes_workload_gets_the_secrets_its_job_needs_and_no_others() -> None:
    documents = [document for path in sorted((DEPLOY / "kubernetes").glob("*.yaml"))
                 for document in yaml.safe_load_all(path.read_text()) if document]
    workloads = {document["metadata"]["name"].removeprefix("sheshnag-"): document for document in documents
                 if document["kind"] in ("Deployment", "StatefulSet")}
    for name, needs in SERVICE_NEEDS.items():
        (container,) = workloads[name]["spec"]["template"]["spec"]["containers"]
        secrets = {source["secretRef"]["name"] for source in container.get("envFrom", []) if "secretRef" in source}
        assert {SECRETS[secret] for secret in secrets if secret in SECRETS} == needs, name
    assert {"nats", "minio", "postgres"} <= workloads.keys()
