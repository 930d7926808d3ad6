"""An organisation's administrator approves (or withdraws) a provider of another tenant for their own organisation:
the answer shows their own organisation's approval only, never the other organisations that approved it (a provider
they may not even read: its GET is 404 to them)."""

from tests.integration.gateway_support import Gateway
from tests.integration.test_gateway_accounts import gateway
from tests.integration.test_gateway_oversight import member, organization
from tests.integration.test_gateway_providers import _json, admin_owner_and_other, register

__all__ = ["gateway"]


async def test_an_organisation_admin_sees_only_their_own_approval_of_anothers_provider(gateway: Gateway) -> None:
    admin, owner, _ = await admin_owner_and_other(gateway)
    first, second = await organization(gateway, admin), await organization(gateway, admin)
    _, first_admin = await member(gateway, admin, first, "fay", role="admin")
    _, second_admin = await member(gateway, admin, second, "sid", role="admin")
    provider = await register(gateway, owner, "rack")
    path = f"/v1/provider/providers/{provider['id']}"
    assert (await _json(gateway.client.post(f"{path}/approve", headers=first_admin)))["approved_organizations"] == [
        first]
    assert (await gateway.client.get(path, headers=second_admin)).status == 404

    approved = await _json(gateway.client.post(f"{path}/approve", headers=second_admin))
    withdrawn = await _json(gateway.client.post(f"{path}/unapprove", headers=second_admin))

    assert approved["approved_organizations"] == [second]
    assert withdrawn["approved_organizations"] == []
    shown = await _json(gateway.client.get(path, headers=owner))  # its owner still sees every approval
    assert shown["approved_organizations"] == [first]
