"""The first API key of a stack: from SHESHNAG_ADMIN_KEY, or generated once and stored only as a hash."""

import secrets
from dataclasses import dataclass
from pathlib import Path

from contracts.events.key import KeyCreated
from contracts.ids import hash_api_key
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


async def register_key(bus: EventBus, key: BootstrapKey, label: str) -> None:
    await bus.publish(KeyCreated(aggregate_id=key.sha256[:32], key_sha256=key.sha256, role="admin", label=label))
