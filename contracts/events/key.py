"""Facts about users and API keys. Only the SHA-256 of a key is ever recorded, in fact bodies: subjects and ids, which
executors see, carry the key's random id, nothing derived from the key."""

from typing import ClassVar, Literal

from contracts.events.envelope import Event
from contracts.ids import key_id_for_hash

KeyRole = Literal["admin", "user", "worker"]
MemberRole = Literal["member", "admin"]
"""A user's role in their organisation: an `admin` of it lists and cancels its members' batches."""


class KeyCreated(Event):
    kind: ClassVar = "key"
    name: ClassVar = "created"
    type: Literal["key.created"] = "key.created"
    key_sha256: str
    key_id: str | None = None
    """The key's public id (`new_key_id`, random), also the fact's aggregate id. None in facts from before key ids
    were random: their id is derived from the hash (`key_id_for_hash`), their aggregate id is the hash's first 32 hex
    digits."""
    role: KeyRole
    label: str
    user_id: str | None = None
    """The user the key acts for; None for keys made before users existed (unrestricted model access)."""
    provider_id: str | None = None
    """For a worker key made by a provider's owner: that provider. None: an admin's or operator's worker key."""

    @property
    def public_id(self) -> str:
        """The key's id as every other fact and record names it."""
        return self.key_id or key_id_for_hash(self.key_sha256)


class KeyRevoked(Event):
    """From now on the key is refused everywhere; its live batches end with `authorization_revoked`. Filed under
    the aggregate id of the key's `KeyCreated` (`contracts.ids.key_aggregate_id`)."""

    kind: ClassVar = "key"
    name: ClassVar = "revoked"
    type: Literal["key.revoked"] = "key.revoked"
    key_sha256: str
    revoked_by_key_id: str | None = None
    """The key that revoked it (an admin's, or a provider owner's for their worker key); None: an operator's CLI."""

    @property
    def key_id(self) -> str:
        """The public id of the key revoked (from its aggregate id; the hash's for a key made before random ids)."""
        return key_id_for_hash(self.key_sha256) if self.aggregate_id == self.key_sha256[:32] else self.aggregate_id


class UserCreated(Event):
    kind: ClassVar = "user"
    name: ClassVar = "created"
    type: Literal["user.created"] = "user.created"
    display_name: str = ""
    allowed_models: list[str] | None = None
    """Catalogue ids the user's keys may use; None: every model in the catalogue."""
    organization_id: str | None = None
    """The organisation the user belongs to; None (and every user made before organisations): the default one."""
    role: MemberRole = "member"
    """Their role in that organisation (every user made before roles: a member)."""
