"""Facts about providers: the people or teams whose executors (joined with their worker keys) serve the fleet."""

from typing import ClassVar, Literal

from contracts.events.envelope import Event


class ProviderRegistered(Event):
    """A signed-in user registered a provider; they (and admins) manage its worker keys and see its executors."""

    kind: ClassVar = "provider"
    name: ClassVar = "registered"
    type: Literal["provider.registered"] = "provider.registered"
    display_name: str
    owner_key_id: str
    """The key that registered it."""
    owner_user_id: str | None = None
    """The user of that key: every key of this user may manage the provider. None: only that key may."""


class ProviderApproved(Event):
    """The provider's executors may run batches beyond its own organisation's: every organisation's (a platform
    admin's approval), or one organisation's (by an administrator of it, or a platform admin)."""

    kind: ClassVar = "provider"
    name: ClassVar = "approved"
    dedup_fields: ClassVar = ("organization_id", "occurred_at")
    type: Literal["provider.approved"] = "provider.approved"
    organization_id: str | None = None
    """None: approved for the whole platform; else for that organisation's batches (its public id: `default`
    for the default organisation)."""
    approved_by_key_id: str


class ProviderApprovalWithdrawn(Event):
    """An approval stated by `ProviderApproved` for the same scope no longer holds; the provider's executors run
    no more of that scope's batches (what they run now is fenced)."""

    kind: ClassVar = "provider"
    name: ClassVar = "approval_withdrawn"
    dedup_fields: ClassVar = ("organization_id", "occurred_at")
    type: Literal["provider.approval_withdrawn"] = "provider.approval_withdrawn"
    organization_id: str | None = None
    """None: the platform-wide approval; else that organisation's."""
    withdrawn_by_key_id: str
