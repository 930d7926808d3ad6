"""A claim of a due webhook delivery: one a lagging replica does not show yet is asked of the leader, and only the
leader's answer that it is gone makes it gone (the due queue then forgets it for good)."""

from types import SimpleNamespace
from typing import Any

import nats.js.errors
import pytest

from services.gateway.webhooks import store as store_module
from services.gateway.webhooks.store import Claim, Due, WebhookStore

CLAIM = Claim("msg_1", "wh_1")


class LaggingReplica:
    """A bucket whose direct gets (any replica) do not show the entry yet."""

    def __init__(self) -> None:
        self.updates: list[tuple[str, bytes, int]] = []

    async def get(self, key: str) -> Any:
        raise nats.js.errors.KeyNotFoundError

    async def update(self, key: str, value: bytes, last: int) -> int:
        self.updates.append((key, value, last))
        return last + 1


async def test_an_entry_a_lagging_replica_does_not_show_is_claimed_as_the_leader_holds_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    bucket = LaggingReplica()
    due = Due(endpoint_id="wh_1", not_before=10.0).model_dump_json().encode()

    async def leader(_: Any, key: str) -> Any:
        return SimpleNamespace(value=due, revision=7)

    monkeypatch.setattr(store_module, "read_entry", leader)
    assert await WebhookStore(bucket).claim(CLAIM, lease_s=30.0, now=20.0) is True  # type: ignore[arg-type]
    assert [(key, last) for key, _, last in bucket.updates] == [("due.msg_1", 7)]


async def test_an_entry_the_leader_does_not_hold_either_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    async def leader(_: Any, key: str) -> None:
        return None

    monkeypatch.setattr(store_module, "read_entry", leader)
    assert await WebhookStore(LaggingReplica()).claim(CLAIM, lease_s=30.0, now=20.0) is None  # type: ignore[arg-type]
