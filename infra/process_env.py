"""What each process of the embedded stack finds in its environment: the operator's, less every secret, plus
only the secrets its own job needs. An environment is readable by the same user alone (`/proc/<pid>/environ`
is 0400); command lines are world-readable, so no secret is ever put on one."""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

Need = Literal["core_nats", "s3", "callout", "worker_key"]

SERVICE_NEEDS: dict[str, frozenset[Need]] = {
    "ledger": frozenset({"core_nats"}),
    "validator": frozenset({"core_nats", "s3"}),
    "scheduler": frozenset({"core_nats", "s3", "callout"}),
    "executor": frozenset({"worker_key"}),
    "gateway": frozenset({"core_nats", "s3"}),
}
"""The ledger folds facts (no objects); the validator reads inputs and writes rejected lines; the scheduler
signs executors' object URLs and admits them to the broker; the gateway stores and serves files; the executor
joins the broker with its worker key alone and reaches objects through the URLs the scheduler signs. None needs
the admin key: `up` registers its hash, gateways check keys by hash."""

STACK_SECRETS = frozenset({
    "SHESHNAG_ADMIN_KEY", "SHESHNAG_NATS_URL", "SHESHNAG_NATS_CALLOUT_SEED", "SHESHNAG_S3_ACCESS_KEY",
    "SHESHNAG_S3_SECRET_KEY", "SHESHNAG_EXECUTOR_WORKER_KEY",
})
"""Never passed on as the operator gave them: each is set below for the processes that need it, or for none."""


@dataclass(frozen=True)
class StackSecrets:
    core_nats_url: str = field(repr=False)
    """The five services' broker URL, with the core user's password in it."""
    executor_nats_url: str
    """The same broker without credentials: the executor adds its own id and worker key."""
    s3_access_key: str = field(repr=False)
    s3_secret_key: str = field(repr=False)
    callout_seed: str = field(repr=False)
    worker_key: str = field(repr=False)


def _passed_on(environ: Mapping[str, str], service: str | None) -> dict[str, str]:
    """The operator's environment less the stack's secrets and less other services' own settings
    (`SHESHNAG_<SERVICE>_…`, e.g. the ledger's Postgres password)."""
    others = tuple(f"SHESHNAG_{other.upper()}_" for other in SERVICE_NEEDS if other != service)
    return {name: value for name, value in environ.items()
            if name.upper() not in STACK_SECRETS and not name.upper().startswith(others)}


GO_MEMORY_LIMIT = "768MiB"
"""The Go runtime's soft memory limit for the embedded broker and object store, unless the operator sets `GOMEMLIMIT`:
their heaps are collected harder as they near it instead of growing with what they cached (a soak of aborted
downloads took SeaweedFS from 130 to 220 MB in two minutes). A soft limit: never a crash for going past it."""


def server_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The broker's and object store's: they read their own secrets from 0600 files."""
    return {"GOMEMLIMIT": GO_MEMORY_LIMIT, **_passed_on(environ, None)}


def service_env(service: str, environ: Mapping[str, str], secrets: StackSecrets,
                settings: Mapping[str, str]) -> dict[str, str]:
    """`settings`: the stack's non-secret wiring (ports, paths) every service gets."""
    needs = SERVICE_NEEDS[service]
    env = _passed_on(environ, service)
    env.update(settings)
    env["SHESHNAG_NATS_URL"] = secrets.core_nats_url if "core_nats" in needs else secrets.executor_nats_url
    if "s3" in needs:
        env["SHESHNAG_S3_ACCESS_KEY"] = secrets.s3_access_key
        env["SHESHNAG_S3_SECRET_KEY"] = secrets.s3_secret_key
    else:
        # Without an endpoint either, nothing falls back to reaching the store directly.
        env.pop("SHESHNAG_S3_ENDPOINT", None)
    if "callout" in needs:
        env["SHESHNAG_NATS_CALLOUT_SEED"] = secrets.callout_seed
    if "worker_key" in needs:
        env["SHESHNAG_EXECUTOR_WORKER_KEY"] = secrets.worker_key
    return env
