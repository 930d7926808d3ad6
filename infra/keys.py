"""Keys of a stack: the first admin key (from SHESHNAG_ADMIN_KEY, or generated once and stored only as a hash),
the embedded executor's worker key, and keys operators create."""

import secrets
from dataclasses import dataclass
from pathlib import Path

from contracts.events.key import KeyCreated, KeyRole
from contracts.ids import hash_api_key, new_api_key
from services.runtime.bus import EventBus


@dataclass(frozen=True)
class BootstrapKey:
    plaintext: str | None
    """Set only when this start created or was given the key; a stored key cannot be shown again."""
    sha256: str


def _marker(data_dir: Path) -> Path:
    return data_dir / "admin-key.sha256"


def choose_admin_key(data_dir: Path, from_env: str | None) -> BootstrapKey:
    marker = _marker(data_dir)
    if from_env:
        return BootstrapKey(from_env, hash_api_key(from_env))
    if marker.exists():
        return BootstrapKey(None, marker.read_text().strip())
    plaintext = f"gk-{secrets.token_urlsafe(32)}"
    return BootstrapKey(plaintext, hash_api_key(plaintext))


def remember(data_dir: Path, key: BootstrapKey) -> None:
    """Only once the key is registered: a lost generated key must not leave a marker behind."""
    if not _marker(data_dir).exists():
        _marker(data_dir).write_text(key.sha256)


async def register_key(bus: EventBus, key: BootstrapKey, label: str, role: KeyRole = "admin",
                       user_id: str | None = None) -> None:
    await bus.publish(KeyCreated(aggregate_id=key.sha256[:32], key_sha256=key.sha256, role=role, label=label,
                                 user_id=user_id))


def new_key(role: KeyRole) -> BootstrapKey:
    plaintext = new_api_key(worker=role == "worker")
    return BootstrapKey(plaintext, hash_api_key(plaintext))


def local_worker_key(data_dir: Path) -> BootstrapKey:
    """The embedded executor's worker key: kept in the data dir (mode 0600) so the executor can present it."""
    path = data_dir / "worker-key"
    if not path.exists():
        path.write_text(new_key("worker").plaintext or "")
        path.chmod(0o600)
    plaintext = path.read_text().strip()
    return BootstrapKey(plaintext, hash_api_key(plaintext))
