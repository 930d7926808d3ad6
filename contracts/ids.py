"""Identifier formats: time-ordered ids for new files and batches, random ids for other new objects, deterministic
ids for objects derived from others."""

import hashlib
import secrets
import time
from typing import Literal

_made_ms = 0
"""The millisecond of the last id this process made: the next takes the later of now and one past it."""


def _time_ordered() -> str:
    """24 hex digits: the creation time in ms, then 48 random bits. Lists order by `created_at`, in seconds, then by
    id: so the newest of several made in one second is also first (in one process exactly; across gateways, to
    their clocks' agreement)."""
    global _made_ms
    _made_ms = max(time.time_ns() // 1_000_000, _made_ms + 1)
    return f"{_made_ms:012x}{secrets.token_hex(6)}"


def new_file_id() -> str:
    return f"file-{_time_ordered()}"


def new_batch_id() -> str:
    return f"batch_{_time_ordered()}"


def derived_id(prefix: str, *parts: str) -> str:
    """A stable id for something derived from other ids, so a retried step names it the same."""
    digest = hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:24]
    return f"{prefix}{digest}"


def output_file_id(batch_id: str) -> str:
    return derived_id("file-", batch_id, "output")


def error_file_id(batch_id: str) -> str:
    return derived_id("file-", batch_id, "error")


ResultFileKind = Literal["output", "error"]


def result_file_name(batch_id: str, kind: ResultFileKind) -> str:
    """The name a batch's output or error file is listed under."""
    return f"{batch_id}_{kind}.jsonl"


def batch_request_id(batch_id: str, custom_id: str) -> str:
    return derived_id("batch_req_", batch_id, custom_id)


def new_key_id() -> str:
    """A new key's public id: random, so it tells nothing about the key (executors see key ids)."""
    return f"key_{secrets.token_hex(8)}"


def key_id_for_hash(key_sha256: str) -> str:
    """The id of a key made before key ids were random (its `KeyCreated` names none): derived from its SHA-256."""
    return f"key_{key_sha256[:16]}"


def key_aggregate_id(key_id: str, key_sha256: str) -> str:
    """The aggregate id (the subject token) of a key's facts: its public id; for a key made before key ids were
    random (its id derived from its hash), the first 32 hex digits of its SHA-256, where its facts already are."""
    return key_sha256[:32] if key_id == key_id_for_hash(key_sha256) else key_id


def hash_api_key(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


def new_api_key(worker: bool) -> str:
    """A raw key: `wk-…` for executors, `gk-…` for the API. Shown once; only its SHA-256 is kept."""
    return f"{'wk-' if worker else 'gk-'}{secrets.token_urlsafe(32)}"


def owner_id(user_id: str | None, key_id: str) -> str:
    """Who owns what a key creates: the key's user, or the key alone when it has none. One KV-key token."""
    return f"user-{user_id}" if user_id is not None else f"key-{key_id}"


def owner_user(owner: str) -> str | None:
    """The user an `owner_id` names; None when it names a key with no user."""
    return owner.removeprefix("user-") if owner.startswith("user-") else None
