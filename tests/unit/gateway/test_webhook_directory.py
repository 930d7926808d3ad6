"""The webhook endpoint directory: a batch fact finds only the endpoints of its owner and of its owner's
organisation, an endpoint changed or deleted is routed as it is now, and a lookup before the directory has read every
endpoint is refused (the fact is taken again) rather than answered from half a directory."""

import asyncio

import pytest

from contracts.api.webhook import WebhookEndpoint
from services.gateway.webhooks.directory import DirectoryNotReady, EndpointDirectory, Endpoints

AT_MS = 2_000_000_000_000


def endpoint(endpoint_id: str, owner: str = "user-alice", *, scope: str = "user", organization: str = "org_a",
             enabled: bool = True, events: tuple[str, ...] = ("batch.completed", "batch.failed")) -> WebhookEndpoint:
    return WebhookEndpoint.model_validate({
        "id": endpoint_id, "url": "https://example.com/hook", "events": list(events), "scope": scope, "owner": owner,
        "organization_id": organization, "enabled": enabled, "description": "", "created_at": 1,
        "secret": "whsec_x"})


def receiving(endpoints: Endpoints, owner: str, organization: str | None,
              event_type: str = "batch.completed") -> list[str]:
    return [found.id for found in endpoints.receivers(event_type, owner, organization, AT_MS)]  # type: ignore[arg-type]


def test_a_fact_finds_its_owners_and_organisations_endpoints_only() -> None:
    endpoints = Endpoints()
    endpoints.put("wh_own", endpoint("wh_own"))
    endpoints.put("wh_org", endpoint("wh_org", "user-boss", scope="organization"))
    endpoints.put("wh_other_org", endpoint("wh_other_org", "user-carol", scope="organization", organization="org_b"))
    for n in range(100):
        endpoints.put(f"wh_bob_{n}", endpoint(f"wh_bob_{n}", "user-bob", organization="org_b"))

    assert receiving(endpoints, "user-alice", "org_a") == ["wh_org", "wh_own"]
    assert receiving(endpoints, "user-alice", None) == ["wh_own"]
    assert receiving(endpoints, "key-stranger", None) == []
    assert len(receiving(endpoints, "user-bob", "org_b")) == 101


def test_an_endpoint_is_routed_as_last_written_and_not_at_all_once_deleted() -> None:
    endpoints = Endpoints()
    endpoints.put("wh_1", endpoint("wh_1"))
    assert endpoints.wanted["batch.completed"] == 1

    endpoints.put("wh_1", endpoint("wh_1", enabled=False))
    assert receiving(endpoints, "user-alice", "org_a") == []
    assert endpoints.wanted["batch.completed"] == 0

    endpoints.put("wh_1", endpoint("wh_1", events=("batch.validated",)))
    assert receiving(endpoints, "user-alice", "org_a") == []
    assert receiving(endpoints, "user-alice", "org_a", "batch.validated") == ["wh_1"]

    endpoints.put("wh_1", endpoint("wh_1", "user-boss", scope="organization", events=("batch.completed",)))
    assert receiving(endpoints, "user-alice", "org_a") == ["wh_1"]
    assert "user-alice" not in endpoints.of_owner

    endpoints.put("wh_1", None)
    assert receiving(endpoints, "user-alice", "org_a") == []
    assert endpoints.by_id == {} and not endpoints.of_owner and not endpoints.of_organization
    assert endpoints.wanted["batch.completed"] == 0
    endpoints.put("wh_1", None)  # a delete seen twice
    assert endpoints.by_id == {}


def test_what_is_kept_holds_no_secret_and_no_address() -> None:
    endpoints = Endpoints()
    endpoints.put("wh_1", endpoint("wh_1"))
    kept = endpoints.by_id["wh_1"]
    assert kept.secret is None and kept.url == ""


async def test_a_lookup_before_every_endpoint_was_read_is_refused_then_answered_once_it_was() -> None:
    directory = EndpointDirectory()
    with pytest.raises(DirectoryNotReady):
        await directory.current(wait_s=0.05)

    async def read_all() -> None:
        await asyncio.sleep(0.05)
        directory.endpoints.put("wh_1", endpoint("wh_1"))
        directory.ready.set()

    task = asyncio.create_task(read_all())
    found = await directory.current(wait_s=5.0)
    await task
    assert list(found.by_id) == ["wh_1"]
    assert directory.owner_of("wh_1") == "user-alice" and directory.owner_of("wh_gone") is None
