"""A caller's endpoints read by id: on a replicated bucket a lagging replica may hold an endpoint a revision behind
(changed, disabled), and a list right after the change must show it as changed."""

from typing import Any

import pytest

from contracts.api.webhook import WebhookEndpoint
from services.gateway.webhooks import store as store_module
from services.gateway.webhooks.store import WebhookStore


def endpoint(enabled: bool) -> bytes:
    return WebhookEndpoint.model_validate({
        "id": "wh_1", "url": "https://example.com/hook", "events": ["batch.completed"], "enabled": enabled,
        "owner": "user-alice", "scope": "user", "organization_id": "", "description": "", "created_at": 1,
    }).model_dump_json().encode()


async def test_an_endpoint_a_lagging_replica_holds_a_revision_behind_is_listed_as_the_leader_holds_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    class Bucket:
        js, stream = object(), "KV_webhooks"

    async def stale(_: Any, keys: list[str]) -> dict[str, bytes]:
        return {key: endpoint(enabled=True) for key in keys}  # the replica: before the endpoint was disabled

    async def leader(_: Any, key: str) -> bytes:
        return endpoint(enabled=False)

    async def replicated(*_: Any) -> bool:
        return True

    monkeypatch.setattr(store_module, "read_last", stale)
    monkeypatch.setattr(store_module, "read_value", leader)
    monkeypatch.setattr(store_module, "replicated", replicated, raising=False)
    [found] = await WebhookStore(Bucket()).get_endpoints(["wh_1"])  # type: ignore[arg-type]
    assert found.enabled is False
