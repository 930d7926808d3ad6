"""The ledger's smaller aggregates: File, ApiKey, User, Executor, Provider, and the EVENTS stream's hash chain (moved
here from `domainmodel`: `register_stable_topics` keeps their stored topics resolving)."""

from typing import Any
from uuid import UUID

from eventsourcing.domain import Aggregate, event
from eventsourcing.utils import register_topic

from contracts.ids import key_id_for_hash
from services.ledger.domainmodel import Batch
from services.ledger.folded import TOPIC_MODULE, Folded, aggregate_id, upcast_defaults


class File(Folded):
    @event("Stored")
    def __init__(self, file_id: str, sequence: int, owner_key_id: str, filename: str, purpose: str,
                 size: int, sha256: str, object_key: str, created_at: int, expires_at: int | None = None,
                 model: str | None = None, demand: dict[str, Any] | None = None) -> None:
        self.file_id, self.owner_key_id, self.filename, self.purpose = file_id, owner_key_id, filename, purpose
        self.size, self.sha256, self.object_key, self.created_at = size, sha256, object_key, created_at
        self.expires_at, self.model, self.demand = expires_at, model, demand
        self.last_sequence, self.anomalies, self.deleted = sequence, [], False

    @classmethod
    def create_id(cls, file_id: str) -> UUID:
        return aggregate_id("file", file_id)

    def delete(self, sequence: int) -> None:
        if not self.refuses(sequence, "deleted", "deleted" if self.deleted else "stored", ("stored",)):
            self._deleted(sequence=sequence)

    @event("Deleted")
    def _deleted(self, sequence: int) -> None:
        self.last_sequence, self.deleted = sequence, True


class ApiKey(Folded):
    class_version = 4
    """Older snapshots are upcast; before v4, every key's id was derived from its hash."""
    upcast_v1_v2 = upcast_defaults(user_id=None, created_at=0, revoked=False)
    upcast_v2_v3 = upcast_defaults(provider_id=None)

    @staticmethod
    def upcast_v3_v4(state: dict[str, Any]) -> None:
        state.setdefault("key_id", key_id_for_hash(state["key_sha256"]))

    @event("Created")
    def __init__(self, key_sha256: str, sequence: int, role: str, label: str, user_id: str | None = None,
                 created_at: int = 0, provider_id: str | None = None, key_id: str | None = None) -> None:
        self.key_sha256, self.role, self.label, self.user_id = key_sha256, role, label, user_id
        # A key created before key ids were random (its fact, and its stored event, name none): derived from its hash.
        self.key_id = key_id or key_id_for_hash(key_sha256)
        self.created_at, self.revoked, self.provider_id = created_at, False, provider_id
        self.last_sequence, self.anomalies = sequence, []

    @classmethod
    def create_id(cls, key_sha256: str) -> UUID:
        return aggregate_id("apikey", key_sha256)

    def revoke(self, sequence: int) -> None:
        if not self.refuses(sequence, "revoked", "revoked" if self.revoked else "active", ("active",)):
            self._revoked(sequence=sequence)

    @event("Revoked")
    def _revoked(self, sequence: int) -> None:
        self.last_sequence, self.revoked = sequence, True


class User(Folded):
    """A user: the keys acting for them share its model access, and what any of them creates."""

    class_version = 3
    """Older snapshots are upcast (the default organisation, a member)."""
    upcast_v1_v2 = upcast_defaults(organization_id=None)
    upcast_v2_v3 = upcast_defaults(role="member")

    @event("Created")
    def __init__(self, user_id: str, sequence: int, display_name: str, allowed_models: list[str] | None,
                 created_at: int, organization_id: str | None = None, role: str = "member") -> None:
        self.user_id, self.display_name, self.created_at = user_id, display_name, created_at
        self.organization_id, self.role = organization_id, role
        self.allowed_models = None if allowed_models is None else list(allowed_models)
        self.last_sequence, self.anomalies = sequence, []

    @classmethod
    def create_id(cls, user_id: str) -> UUID:
        return aggregate_id("user", user_id)


class Executor(Folded):
    """An executor's registrations (one per start) and losses, for audits of who ran what, and the lines it served."""

    class_version = 3
    upcast_v1_v2 = upcast_defaults(worker_key_id=None, last_heartbeat_at=None, lines_served=0)
    upcast_v2_v3 = upcast_defaults(provider_id=None)

    @event("Registered")
    def __init__(self, executor_id: str, sequence: int, engine: str, engine_version: str, models: list[str],
                 started_at: int, worker_key_id: str | None = None, provider_id: str | None = None) -> None:
        self.executor_id, self.last_sequence, self.anomalies = executor_id, sequence, []
        self.engine, self.engine_version, self.models = engine, engine_version, list(models)
        self.started_at, self.status, self.registrations = started_at, "online", 1
        self.worker_key_id, self.provider_id = worker_key_id, provider_id
        self.last_heartbeat_at: int | None = None
        self.lines_served = 0

    @classmethod
    def create_id(cls, executor_id: str) -> UUID:
        return aggregate_id("executor", executor_id)

    def register_again(self, sequence: int, engine: str, engine_version: str, models: list[str],
                       started_at: int, worker_key_id: str | None = None, provider_id: str | None = None) -> None:
        if not self.has_folded(sequence):
            self._registered_again(sequence, engine, engine_version, models, started_at, worker_key_id, provider_id)

    @event("RegisteredAgain")
    def _registered_again(self, sequence: int, engine: str, engine_version: str, models: list[str],
                          started_at: int, worker_key_id: str | None = None, provider_id: str | None = None) -> None:
        self.last_sequence, self.status, self.registrations = sequence, "online", self.registrations + 1
        self.engine, self.engine_version, self.models = engine, engine_version, list(models)
        self.started_at, self.worker_key_id, self.provider_id = started_at, worker_key_id, provider_id

    def lose(self, sequence: int, last_heartbeat_at: int) -> None:
        if not self.refuses(sequence, "lost", self.status, ("online",)):
            self._lost(sequence=sequence, last_heartbeat_at=last_heartbeat_at)

    @event("Lost")
    def _lost(self, sequence: int, last_heartbeat_at: int) -> None:
        self.last_sequence, self.status, self.last_heartbeat_at = sequence, "lost", last_heartbeat_at

    @event("Served")
    def serve(self, lines: int) -> None:
        """Its attempts made `lines` more lines durable. Exactly once because the batch applies each progress fact
        once; no sequence is kept, since progress is applied at a group's end, out of stream order with this."""
        self.lines_served += lines


class Provider(Folded):
    """A provider: who owns it (a user, or the one key that registered it); its worker keys name it."""

    class_version = 2
    """Older snapshots are upcast (v2 added its approvals)."""
    upcast_v1_v2 = upcast_defaults(approved_platform_wide=False, approved_organizations=[])

    @event("Registered")
    def __init__(self, provider_id: str, sequence: int, display_name: str, owner_key_id: str,
                 owner_user_id: str | None, created_at: int) -> None:
        self.provider_id, self.display_name, self.created_at = provider_id, display_name, created_at
        self.owner_key_id, self.owner_user_id = owner_key_id, owner_user_id
        self.last_sequence, self.anomalies = sequence, []
        self.approved_platform_wide = False
        self.approved_organizations: list[str] = []

    @classmethod
    def create_id(cls, provider_id: str) -> UUID:
        return aggregate_id("provider", provider_id)

    def approve(self, sequence: int, organization_id: str | None, approved: bool) -> None:
        """An approval or its withdrawal, for the platform (`organization_id` None) or one organisation; idempotent."""
        if not self.has_folded(sequence):
            self._approval_set(sequence=sequence, organization_id=organization_id, approved=approved)

    @event("ApprovalSet")
    def _approval_set(self, sequence: int, organization_id: str | None, approved: bool) -> None:
        self.last_sequence = sequence
        if organization_id is None:
            self.approved_platform_wide = approved
            return
        others = [org for org in self.approved_organizations if org != organization_id]
        self.approved_organizations = sorted([*others, organization_id] if approved else others)


CHAIN_ID = aggregate_id("chain", "EVENTS")


class StreamChain(Aggregate):
    """The head of the EVENTS hash chain; each `Linked` keeps a short digest of every event it covers."""

    @event("Started")
    def __init__(self) -> None:
        self.head, self.last_sequence = "", 0

    @classmethod
    def create_id(cls) -> UUID:
        return CHAIN_ID

    class Linked(Aggregate.Event):
        first_sequence: int
        digests: list[str]
        head: str

    @event(Linked)
    def link(self, first_sequence: int, digests: list[str], head: str) -> None:
        """Sequences first_sequence.. (contiguous) are chained; `head` is the chain after the last of them."""
        self.head, self.last_sequence = head, first_sequence + len(digests) - 1


def register_stable_topics() -> None:
    """Let topics stored under TOPIC_MODULE resolve even after these classes move to another module."""
    for aggregate in (Folded, Batch, File, ApiKey, User, Executor, Provider, StreamChain):
        if aggregate.__module__ == TOPIC_MODULE:
            continue
        register_topic(f"{TOPIC_MODULE}:{aggregate.__qualname__}", aggregate)
        for name, value in vars(aggregate).items():
            if isinstance(value, type) and issubclass(value, Aggregate.Event):
                register_topic(f"{TOPIC_MODULE}:{aggregate.__qualname__}.{name}", value)
