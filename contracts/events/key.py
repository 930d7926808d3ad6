"""Facts about API keys. Only the SHA-256 of a key is ever recorded."""

from typing import ClassVar, Literal

from contracts.events.envelope import Event

KeyRole = Literal["admin", "user", "worker"]


class KeyCreated(Event):
    kind: ClassVar = "key"
    name: ClassVar = "created"
    type: Literal["key.created"] = "key.created"
    key_sha256: str
    role: KeyRole
    label: str
