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


def test_a_limit_counts_the_endpoints_of_one_holder_and_a_list_those_the_caller_manages() -> None:
    endpoints = Endpoints()
    endpoints.put("wh_own", endpoint("wh_own"))
    endpoints.put("wh_own_org", endpoint("wh_own_org", scope="organization"))
    endpoints.put("wh_boss_org", endpoint("wh_boss_org", "user-boss", scope="organization"))
    endpoints.put("wh_bob", endpoint("wh_bob", "user-bob"))

    assert endpoints.counted_with(endpoint("wh_new")) == {"wh_own"}
    assert endpoints.counted_with(endpoint("wh_new", "user-carol", scope="organization")) == {
        "wh_own_org", "wh_boss_org"}
    assert endpoints.managed_by("user-alice", None) == ["wh_own", "wh_own_org"]
    assert endpoints.managed_by("user-alice", "org_a") == ["wh_boss_org", "wh_own", "wh_own_org"]
    assert endpoints.managed_by("user-stranger", None) == []


async def test_a_lookup_waits_until_every_endpoint_and_the_newest_write_were_read() -> None:
    directory = EndpointDirectory()
    with pytest.raises(DirectoryNotReady):
        await directory.holding(0, wait_s=0.05)

    def watched(sequence: int) -> None:
        directory.put(f"endpoint.wh_{sequence}", endpoint(f"wh_{sequence}").model_dump_json().encode(), sequence)

    directory.restart()
    watched(3)
    with pytest.raises(DirectoryNotReady):  # the watch has not shown every current endpoint yet
        await directory.holding(3, wait_s=0.05)
    directory.current()
    with pytest.raises(DirectoryNotReady):  # the write at 4 (acknowledged to someone) is not applied yet
        await directory.holding(4, wait_s=0.1)

    async def later() -> None:
        await asyncio.sleep(0.05)
        watched(4)

    task = asyncio.create_task(later())
    found = await directory.holding(4, wait_s=5.0)
    await task
    assert sorted(found.by_id) == ["wh_3", "wh_4"] and found.applied == 4
    assert directory.owner_of("wh_3") == "user-alice" and directory.owner_of("wh_gone") is None

    directory.lost()  # a broken watch: lookups wait for the next one
    with pytest.raises(DirectoryNotReady):
        await directory.holding(0, wait_s=0.05)
    directory.restart()
    directory.put("endpoint.wh_3", None, 5)
    directory.current()
    assert (await directory.holding(5)).by_id == {}
