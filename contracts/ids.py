"""Identifier formats: random ids for new objects, deterministic ids for objects derived from others."""

import hashlib
import secrets


def new_file_id() -> str:
    return f"file-{secrets.token_hex(12)}"


def new_batch_id() -> str:
    return f"batch_{secrets.token_hex(12)}"


def derived_id(prefix: str, *parts: str) -> str:
    """A stable id for something derived from other ids, so a retried step names it the same."""
    digest = hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:24]
    return f"{prefix}{digest}"


def output_file_id(batch_id: str) -> str:
    return derived_id("file-", batch_id, "output")


def error_file_id(batch_id: str) -> str:
    return derived_id("file-", batch_id, "error")


def batch_request_id(batch_id: str, custom_id: str) -> str:
    return derived_id("batch_req_", batch_id, custom_id)


def key_id_for_hash(key_sha256: str) -> str:
    return f"key_{key_sha256[:16]}"


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
