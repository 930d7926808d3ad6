"""Facts about organisations: the groups users belong to."""

from typing import ClassVar, Literal

from contracts.events.envelope import Event


class OrganizationCreated(Event):
    kind: ClassVar = "organization"
    name: ClassVar = "created"
    type: Literal["organization.created"] = "organization.created"
    display_name: str = ""
