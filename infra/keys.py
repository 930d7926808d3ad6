"""Keys of a stack: the first admin key (from SHESHNAG_ADMIN_KEY, or generated once and stored only as a hash),
the embedded executor's worker key, and keys operators create."""

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from pathlib import Path

from contracts.events.key import KeyCreated, KeyRole
from contracts.ids import hash_api_key, new_api_key
from infra.private import write_private
from services.runtime.nats.bus import EventBus

KEY_ID_SECRET = "key-id-secret"


@dataclass(frozen=True)
class BootstrapKey:
    plaintext: str | None
    """Set only when this start created or was given the key; a stored key cannot be shown again."""
    sha256: str
    key_id: str
    """Its public id (`bootstrap_key_id`)."""


def bootstrap_key_id(data_dir: Path, key_sha256: str) -> str:
    """The id of a key the stack registers at every start (its admin key, its executor's worker key): the same each
    time, so a registration again is the same fact, yet nothing anyone can test a guessed key against (executors see
    key ids): an HMAC of the key's hash under a secret that never leaves the data dir."""
    path = data_dir / KEY_ID_SECRET
    if not path.exists():
        write_private(path, secrets.token_hex(32).encode())
    secret = path.read_text().strip().encode()
    return f"key_{hmac.new(secret, key_sha256.encode(), hashlib.sha256).hexdigest()[:16]}"


def _marker(data_dir: Path) -> Path:
    return data_dir / "admin-key.sha256"


def choose_admin_key(data_dir: Path, from_env: str | None) -> BootstrapKey:
    marker = _marker(data_dir)
    if from_env:
        plaintext: str | None = from_env
        digest = hash_api_key(from_env)
    elif marker.exists():
        plaintext, digest = None, marker.read_text().strip()
    else:
        plaintext = f"gk-{secrets.token_urlsafe(32)}"
        digest = hash_api_key(plaintext)
    return BootstrapKey(plaintext, digest, bootstrap_key_id(data_dir, digest))


def remember(data_dir: Path, key: BootstrapKey) -> None:
    """Only once the key is registered: a lost generated key must not leave a marker behind."""
    if not _marker(data_dir).exists():
        _marker(data_dir).write_text(key.sha256)


async def register_key(bus: EventBus, key: BootstrapKey, label: str, role: KeyRole = "admin",
                       user_id: str | None = None) -> None:
    await bus.publish(KeyCreated(aggregate_id=key.key_id, key_id=key.key_id, key_sha256=key.sha256, role=role,
                                 label=label, user_id=user_id))


def local_worker_key(data_dir: Path) -> BootstrapKey:
    """The embedded executor's worker key: kept in the data dir (mode 0600) so the executor can present it."""
    path = data_dir / "worker-key"
    if not path.exists():
        write_private(path, new_api_key(worker=True).encode())
    plaintext = path.read_text().strip()
    digest = hash_api_key(plaintext)
    return BootstrapKey(plaintext, digest, bootstrap_key_id(data_dir, digest))
