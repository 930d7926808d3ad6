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
