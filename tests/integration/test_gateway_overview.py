"""The operator's overview against a real gateway, ledger, NATS and S3: each owner's share of the fleet, from the
facts the services publish about their batches."""

import secrets
import time
from typing import Any

import pytest

from contracts.api.batch import BatchUsage
from contracts.events.batch import (
    BatchAssigned,
    BatchCompleted,
    BatchFinalizing,
    BatchProgressed,
    BatchStarted,
    BatchValidated,
)
from contracts.events.envelope import Event
from contracts.subjects import READ_MODEL_BUCKET
from tests.factories import batch_created
from tests.integration.gateway_support import Gateway, key_listings_during
from tests.integration.test_gateway_accounts import CHAT, admin_key, gateway
from tests.integration.test_gateway_providers import eventually

__all__ = ["gateway"]

Headers = dict[str, str]


async def user_key_in(gateway: Gateway, admin: Headers, organization_id: str | None) -> tuple[str, str]:
    """A new user (in `organization_id`, or the default organisation) and the id of a key of theirs."""
    user_id = f"u-{secrets.token_hex(4)}"
    body = {"id": user_id, "name": user_id} | ({"organization_id": organization_id} if organization_id else {})
    created = await gateway.client.post("/v1/organization/users", json=body, headers=admin)
    assert created.status == 200, await created.text()
    key = await gateway.client.post("/v1/organization/keys", json={"user_id": user_id, "name": "k"}, headers=admin)
    assert key.status == 200, await key.text()
    return user_id, (await key.json())["id"]


def batch_facts(key_id: str, total: int, done: int | None, finished: bool = False) -> list[Event]:
    """A batch of `key_id`'s as the services tell it: validated; then (`done` not None) run up to `done` lines;
    then (`finished`) completed."""
    batch_id, now = f"batch_{secrets.token_hex(8)}", int(time.time())
    facts: list[Event] = [
        batch_created(batch_id, key_id, "files/file-x", created_at=now, expires_at=now + 86400),
        BatchValidated(aggregate_id=batch_id, total_lines=total, model=CHAT)]
    if done is not None:
        facts += [BatchAssigned(aggregate_id=batch_id, executor_id="exec-shares", attempt=1, lease_token="lease"),
                  BatchStarted(aggregate_id=batch_id, executor_id="exec-shares", attempt=1, engine="llamacpp",
                               engine_version="test"),
                  BatchProgressed(aggregate_id=batch_id, attempt=1, chunk=0, chunk_key="c0", completed=done,
                                  failed=0)]
    if finished:
        facts += [BatchFinalizing(aggregate_id=batch_id, attempt=1),
                  BatchCompleted(aggregate_id=batch_id, output_file_id="file-out", error_file_id=None,
                                 completed=total, failed=0, usage=BatchUsage())]
    return facts


async def test_an_admin_sees_each_owners_share_of_the_lines_the_fleet_committed_lately(gateway: Gateway) -> None:
    admin = await admin_key(gateway)
    organization_id = f"org-{secrets.token_hex(4)}"
    made = await gateway.client.post("/v1/organization/organizations", json={"id": organization_id}, headers=admin)
    assert made.status == 200, await made.text()
    (ann, ann_key), (bob, bob_key), (cy, cy_key) = [await user_key_in(gateway, admin, org)
                                                    for org in (organization_id, None, None)]
    for fact in [*batch_facts(ann_key, 40, 30), *batch_facts(bob_key, 10, 10, finished=True),
                 *batch_facts(cy_key, 5, None)]:
        await gateway.bus.publish(fact)

    async def owners() -> dict[str, dict[str, Any]]:
        view = await (await gateway.client.get("/v1/organization/overview", headers=admin)).json()
        return {row["owner"]: row for row in view["owners"]}

    mine = (f"user-{ann}", f"user-{bob}", f"user-{cy}")
    rows = await eventually(owners, lambda rows: all(owner in rows for owner in mine)
                            and rows[mine[1]]["running_batches"] == 0)
    shown = {owner: {k: rows[owner][k] for k in ("user_id", "organization_id", "running_batches", "queued_batches",
                                                  "lines_left", "recent_lines")} for owner in mine}
    assert shown == {
        f"user-{ann}": {"user_id": ann, "organization_id": organization_id, "running_batches": 1,
                        "queued_batches": 0, "lines_left": 10, "recent_lines": 30},
        f"user-{bob}": {"user_id": bob, "organization_id": None, "running_batches": 0, "queued_batches": 0,
                        "lines_left": 0, "recent_lines": 10},
        f"user-{cy}": {"user_id": cy, "organization_id": None, "running_batches": 0, "queued_batches": 1,
                       "lines_left": 5, "recent_lines": 0},
    }
    # Other tests' batches share this broker: the shares are of everything, and add up to the whole.
    assert rows[mine[0]]["share"] > rows[mine[1]]["share"] > rows[mine[2]]["share"] == 0
    assert abs(sum(row["share"] for row in rows.values()) - 1) < 0.01
    assert rows[mine[0]]["share"] == pytest.approx(rows[mine[1]]["share"] * 3, rel=1e-3)


async def test_the_overview_reads_no_batch_record_and_no_listing_of_users(gateway: Gateway) -> None:
    admin = await admin_key(gateway)
    _, key = await user_key_in(gateway, admin, None)
    for fact in [*batch_facts(key, 7, 3), *batch_facts(key, 2, 2, finished=True)]:
        await gateway.bus.publish(fact)

    async def looked() -> dict[str, Any]:
        return dict(await (await gateway.client.get("/v1/organization/overview", headers=admin)).json())

    await eventually(looked, lambda view: any(row["lines_left"] == 4 and row["recent_lines"] == 5
                                              for row in view["owners"]))
    views: list[dict[str, Any]] = []

    async def look() -> None:
        views.append(await looked())

    listings = await key_listings_during(gateway, look, (f"{READ_MODEL_BUCKET}.batch.>".encode(), b".user.>"))
    assert listings == [] and views[0]["batches_by_status"].get("completed", 0) >= 1
