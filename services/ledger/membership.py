"""Who belongs to whom: organisations, and the user each key acts for (found by the key's public id)."""

from uuid import UUID

from eventsourcing.domain import event

from services.ledger.folded import Folded, aggregate_id


class Organization(Folded):
    """A group of users; users created without one belong to the default organisation."""

    @event("Created")
    def __init__(self, organization_id: str, sequence: int, display_name: str, created_at: int) -> None:
        self.organization_id, self.display_name, self.created_at = organization_id, display_name, created_at
        self.last_sequence, self.anomalies = sequence, []

    @classmethod
    def create_id(cls, organization_id: str) -> UUID:
        return aggregate_id("organization", organization_id)


class KeyOwner(Folded):
    """The user a key acts for, by the key's `key_…` id (the name facts give it); only keys with a user have one."""

    @event("Created")
    def __init__(self, key_id: str, sequence: int, user_id: str) -> None:
        self.key_id, self.user_id = key_id, user_id
        self.last_sequence, self.anomalies = sequence, []

    @classmethod
    def create_id(cls, key_id: str) -> UUID:
        return aggregate_id("keyowner", key_id)
