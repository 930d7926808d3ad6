"""Webhooks against a real gateway, ledger, NATS and S3, delivered to a real local HTTP receiver: endpoints are
registered and managed per user or organisation, each batch fact is POSTed signed per Standard Webhooks (checked
with the `standardwebhooks` library) to exactly the endpoints that receive it, failed attempts are retried with
backoff under the same `webhook-id` and shown on the delivery, and a gateway stopped and started again neither
loses a delivery nor sends one under a new id."""

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from contracts.api.webhook import DeliveryAttempt, DeliveryStatus, WebhookDelivery, WebhookEvent, WebhookEventData
from contracts.events.batch import BatchCancelled, BatchValidated, BatchValidationFailed
from contracts.events.envelope import Event
from contracts.subjects import WEBHOOKS_BUCKET
from services.gateway.settings import GatewaySettings
from services.gateway.webhooks import store as webhook_store
from services.gateway.webhooks.deliverer import Attempts
from services.gateway.webhooks.due_queue import DueQueue
from services.gateway.webhooks.store import Claim, WebhookStore
from services.runtime.nats.bus import EventBus
from services.runtime.nats.kv import open_bucket, read_subject
from services.runtime.process.settings import ConnectionSettings
from tests.integration.gateway_support import Gateway, jsonl, running_gateway
from tests.integration.test_gateway_accounts import Headers, admin_key
from tests.integration.test_gateway_oversight import member, organization

FAST = {"webhook_retry_delays_s": [0.3, 0.3], "webhook_poll_interval_s": 0.1, "webhook_timeout_s": 2.0,
        "webhook_allowed_cidrs": ["127.0.0.0/8"]}
"""Quick retries, and the local receivers allowed (a deployment's default allows public addresses only)."""
WAIT_S = 20.0
OLD_S = 100_000.0
"""Age of the deliveries a prune must erase: older than any other test of this module made."""


@dataclass
class Receiver:
    """A local webhook receiver: it answers each POST with the next of `answers` (then 200), and keeps them all."""

    url: str = ""
    received: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    answers: list[int] = field(default_factory=list)
    stall: asyncio.Event | None = None
    """Set to an event: each POST is answered only once it is set."""

    async def handle(self, request: web.Request) -> web.Response:
        self.received.append(({k.lower(): v for k, v in request.headers.items()}, await request.read()))
        if self.stall is not None:
            await self.stall.wait()
        return web.Response(status=self.answers.pop(0) if self.answers else 200)

    def bodies_for(self, batch_id: str) -> list[tuple[dict[str, str], bytes]]:
        return [(headers, body) for headers, body in self.received if batch_id.encode() in body]


@contextlib.asynccontextmanager
async def serving_receiver() -> AsyncIterator[Receiver]:
    """A `Receiver` listening on a free loopback port, until the block ends."""
    found = Receiver()
    app = web.Application()
    app.router.add_post("/hook", found.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    found.url = f"http://127.0.0.1:{port}/hook"
    try:
        yield found
    finally:
        await runner.cleanup()


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    async with serving_receiver() as found:
        yield found


@pytest.fixture(scope="module")
async def gateway(connection: ConnectionSettings) -> AsyncIterator[Gateway]:
    async with running_gateway(connection, **FAST) as running:
        yield running


async def register(gateway: Gateway, headers: Headers, url: str, **fields: Any) -> dict[str, Any]:
    answer = await gateway.client.post("/v1/webhooks", headers=headers, json={"url": url, **fields})
    assert answer.status == 200, await answer.text()
    return dict(await answer.json())


async def new_batch(gateway: Gateway, headers: Headers) -> str:
    uploaded = await gateway.upload(headers, jsonl("a", "b", secrets.token_hex(4)))
    assert uploaded.status == 200, await uploaded.text()
    created = await gateway.client.post("/v1/batches", headers=headers, json={
        "input_file_id": (await uploaded.json())["id"], "endpoint": "/v1/chat/completions",
        "completion_window": "24h"})
    assert created.status == 200, await created.text()
    return str((await created.json())["id"])


def validated(batch_id: str) -> BatchValidated:
    """The fact a validator states (no validator runs here: the test states it)."""
    return BatchValidated(aggregate_id=batch_id, total_lines=2, model="smollm2")


def cancelled(batch_id: str) -> BatchCancelled:
    return BatchCancelled(aggregate_id=batch_id, output_file_id=None, error_file_id=None, completed=0, failed=0,
                          usage={"input_tokens": 0, "output_tokens": 0, "total_tokens": 0})


async def until(check: Callable[[], Awaitable[bool] | bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        outcome = check()
        if await outcome if isinstance(outcome, Awaitable) else outcome:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def deliveries(gateway: Gateway, headers: Headers, endpoint_id: str) -> list[dict[str, Any]]:
    answer = await gateway.client.get(f"/v1/webhooks/{endpoint_id}/deliveries?limit=100", headers=headers)
    assert answer.status == 200, await answer.text()
    return list((await answer.json())["data"])


async def publish(gateway: Gateway, fact: Event) -> None:
    await gateway.bus.publish(fact)


async def test_a_registered_endpoint_gets_each_fact_signed_per_standard_webhooks(
        gateway: Gateway, receiver: Receiver) -> None:
    alice = await gateway.new_key()
    endpoint = await register(gateway, alice, receiver.url, events=["batch.validated", "batch.cancelled"])
    assert endpoint["secret"].startswith("whsec_") and endpoint["object"] == "webhook_endpoint"
    batch_id = await new_batch(gateway, alice)

    await publish(gateway, validated(batch_id))
    await until(lambda: len(receiver.bodies_for(batch_id)) == 1, "the first webhook")
    await asyncio.sleep(2.5)  # the intake has found nothing to take for a while
    await publish(gateway, cancelled(batch_id))
    await until(lambda: len(receiver.bodies_for(batch_id)) == 2, "both webhooks")

    verifier = Webhook(endpoint["secret"])
    events = [verifier.verify(body, headers) for headers, body in receiver.bodies_for(batch_id)]
    assert [event["type"] for event in events] == ["batch.validated", "batch.cancelled"]
    assert all(event["object"] == "event" and event["data"] == {"id": batch_id} for event in events)
    assert all(event["id"].startswith("evt_") for event in events)
    ids = [headers["webhook-id"] for headers, _ in receiver.bodies_for(batch_id)]
    assert len(set(ids)) == 2 and all(i.startswith("msg_") for i in ids)
    with pytest.raises(WebhookVerificationError):  # another secret's signature does not verify
        headers, body = receiver.bodies_for(batch_id)[0]
        Webhook("whsec_" + "A" * 43 + "=").verify(body, headers)

    shown = await deliveries(gateway, alice, endpoint["id"])
    assert {d["status"] for d in shown} == {"delivered"}
    assert all(len(d["attempts"]) == 1 and d["attempts"][0]["status_code"] == 200 for d in shown)


async def test_the_same_fact_stated_twice_is_delivered_once(gateway: Gateway, receiver: Receiver) -> None:
    alice = await gateway.new_key()
    await register(gateway, alice, receiver.url, events=["batch.validated"])
    batch_id = await new_batch(gateway, alice)
    fact = validated(batch_id)
    await publish(gateway, fact)
    await until(lambda: len(receiver.bodies_for(batch_id)) == 1, "the webhook")
    # A fact published again under another message id (a replay, a second validator): same event, same delivery.
    await gateway.bus.js.publish(fact.subject, fact.model_dump_json().encode())
    await asyncio.sleep(1.5)
    assert len(receiver.bodies_for(batch_id)) == 1


async def test_only_the_owner_and_the_owners_organisation_receive_a_batchs_events(
        gateway: Gateway, receiver: Receiver) -> None:
    admin = await admin_key(gateway)
    org = await organization(gateway, admin)
    _, alice = await member(gateway, admin, org, "alice")
    _, boss = await member(gateway, admin, org, "boss", role="admin")
    _, bob = await member(gateway, admin, await organization(gateway, admin), "bob")
    own = await register(gateway, alice, receiver.url + "?who=alice")
    org_wide = await register(gateway, boss, receiver.url + "?who=org", scope="organization")
    await register(gateway, bob, receiver.url + "?who=bob")
    batch_id = await new_batch(gateway, alice)

    await publish(gateway, validated(batch_id))
    await until(lambda: len(receiver.bodies_for(batch_id)) == 2, "two webhooks")
    await asyncio.sleep(0.5)
    assert len(receiver.bodies_for(batch_id)) == 2
    assert len(await deliveries(gateway, alice, own["id"])) == 1
    assert len(await deliveries(gateway, boss, org_wide["id"])) == 1
    assert org_wide["organization_id"] == org

    # Each sees and manages only their own endpoints (and an organisation's administrator its organisation's).
    assert [e["id"] for e in (await (await gateway.client.get("/v1/webhooks", headers=alice)).json())["data"]] == [
        own["id"]]
    assert (await gateway.client.get(f"/v1/webhooks/{own['id']}", headers=bob)).status == 404
    assert (await gateway.client.delete(f"/v1/webhooks/{org_wide['id']}", headers=alice)).status == 404
    refused = await gateway.client.post("/v1/webhooks", headers=alice, json={"url": receiver.url,
                                                                             "scope": "organization"})
    assert refused.status == 403
    assert (await refused.json())["error"]["code"] == "insufficient_permissions"


async def test_a_refused_delivery_is_retried_with_the_same_id_until_the_endpoint_takes_it(
        gateway: Gateway, receiver: Receiver) -> None:
    alice = await gateway.new_key()
    endpoint = await register(gateway, alice, receiver.url, events=["batch.failed"])
    batch_id = await new_batch(gateway, alice)
    receiver.answers = [500, 503]

    await publish(gateway, BatchValidationFailed(aggregate_id=batch_id, total_lines=2, error_count=2))
    await until(lambda: len(receiver.bodies_for(batch_id)) == 3, "three attempts")
    assert len({headers["webhook-id"] for headers, _ in receiver.bodies_for(batch_id)}) == 1
    headers, body = receiver.bodies_for(batch_id)[-1]
    event = Webhook(endpoint["secret"]).verify(body, headers)
    assert event["type"] == "batch.failed"

    async def delivered() -> bool:
        return [d["status"] for d in await deliveries(gateway, alice, endpoint["id"])] == ["delivered"]

    await until(delivered, "the delivery to be recorded delivered")
    [delivery] = await deliveries(gateway, alice, endpoint["id"])
    assert [a["status_code"] for a in delivery["attempts"]] == [500, 503, 200]
    assert delivery["attempts"][0]["error"] == "the endpoint answered HTTP 500"


async def test_a_delivery_out_of_attempts_fails_and_can_be_sent_again(gateway: Gateway, receiver: Receiver) -> None:
    alice = await gateway.new_key()
    endpoint = await register(gateway, alice, receiver.url, events=["batch.cancelled"])
    batch_id = await new_batch(gateway, alice)
    receiver.answers = [500, 500, 500]

    await publish(gateway, cancelled(batch_id))

    async def failed() -> bool:
        return [d["status"] for d in await deliveries(gateway, alice, endpoint["id"])] == ["failed"]

    await until(failed, "the delivery to fail")
    [delivery] = await deliveries(gateway, alice, endpoint["id"])
    assert len(delivery["attempts"]) == 3  # the first and one per retry delay
    again = await gateway.client.post(f"/v1/webhooks/{endpoint['id']}/deliveries/{delivery['id']}/redeliver",
                                      headers=alice)
    assert again.status == 200, await again.text()

    async def delivered() -> bool:
        return [d["status"] for d in await deliveries(gateway, alice, endpoint["id"])] == ["delivered"]

    await until(delivered, "the redelivery")
    assert len({headers["webhook-id"] for headers, _ in receiver.bodies_for(batch_id)}) == 1


async def test_endpoints_are_checked_changed_rotated_and_deleted(gateway: Gateway, receiver: Receiver) -> None:
    alice = await gateway.new_key()
    for body, code in (({"url": "ftp://example.com/x"}, "invalid_url"), ({"url": "not a url at all"}, "invalid_url"),
                       ({"url": receiver.url, "events": ["batch.exploded"]}, None), ({}, None)):
        answer = await gateway.client.post("/v1/webhooks", headers=alice, json=body)
        assert answer.status == 400, await answer.text()
        error = (await answer.json())["error"]
        assert set(error) == {"message", "type", "param", "code"}
        if code:
            assert error["code"] == code
    endpoint = await register(gateway, alice, receiver.url)
    # A limit is 1 to 100 in ASCII digits, as in every list.
    for limit in ("0", "101", "+5", " 7", "1_0", "\u0663", "\u00b2"):
        refused = await gateway.client.get(f"/v1/webhooks/{endpoint['id']}/deliveries", headers=alice,
                                           params={"limit": limit})
        assert refused.status == 400 and (await refused.json())["error"]["code"] == "invalid_limit", limit
    listed = (await (await gateway.client.get("/v1/webhooks", headers=alice)).json())["data"]
    assert listed[0]["secret"] is None and len(listed[0]["events"]) == 5
    changed = await gateway.client.post(f"/v1/webhooks/{endpoint['id']}", headers=alice,
                                        json={"enabled": False, "events": ["batch.completed"]})
    assert (await changed.json())["enabled"] is False
    rotated = await (await gateway.client.post(f"/v1/webhooks/{endpoint['id']}/rotate_secret", headers=alice)).json()
    assert rotated["secret"].startswith("whsec_") and rotated["secret"] != endpoint["secret"]
    gone = await gateway.client.delete(f"/v1/webhooks/{endpoint['id']}", headers=alice)
    assert (await gone.json()) == {"id": endpoint["id"], "object": "webhook_endpoint.deleted", "deleted": True}
    assert (await gateway.client.get(f"/v1/webhooks/{endpoint['id']}", headers=alice)).status == 404


async def test_a_disabled_endpoint_gets_nothing(gateway: Gateway, receiver: Receiver) -> None:
    alice = await gateway.new_key()
    endpoint = await register(gateway, alice, receiver.url)
    await gateway.client.post(f"/v1/webhooks/{endpoint['id']}", headers=alice, json={"enabled": False})
    batch_id = await new_batch(gateway, alice)
    await publish(gateway, validated(batch_id))
    await asyncio.sleep(1.5)
    assert receiver.bodies_for(batch_id) == []


async def test_a_gateway_restarted_mid_retry_delivers_under_the_same_id_and_takes_facts_stated_while_down(
        connection: ConnectionSettings, receiver: Receiver) -> None:
    slow = {**FAST, "webhook_retry_delays_s": [2.0]}
    async with running_gateway(connection, **slow) as first:
        alice = await first.new_key()
        endpoint = await register(first, alice, receiver.url)
        early, late = await new_batch(first, alice), await new_batch(first, alice)
        receiver.answers = [500]
        await publish(first, validated(early))
        await until(lambda: len(receiver.bodies_for(early)) == 1, "the first attempt")
        await until(lambda: retry_recorded(first, alice, endpoint["id"]), "the first attempt's failure recorded")
    # No gateway runs: the retry falls due, and a new fact is stated.
    bus = await EventBus.connect(connection.nats_url, "tests-webhooks")
    await bus.publish(validated(late))
    await bus.close()
    async with running_gateway(connection, **slow) as second:
        await until(lambda: len(receiver.bodies_for(early)) == 2, "the retry due while no gateway ran")
        await until(lambda: len(receiver.bodies_for(late)) == 1, "the fact stated while no gateway ran")
        assert len({headers["webhook-id"] for headers, _ in receiver.bodies_for(early)}) == 1
        assert {d["status"] for d in await deliveries(second, alice, endpoint["id"])} == {"delivered"}



async def retry_recorded(gateway: Gateway, headers: Headers, endpoint_id: str) -> bool:
    return any(d["attempts"] and d["next_attempt_at"] for d in await deliveries(gateway, headers, endpoint_id))


async def test_ids_that_are_not_ours_are_not_found(gateway: Gateway) -> None:
    alice = await gateway.new_key()
    for path in ("/v1/webhooks/%C2%AA%5C", "/v1/webhooks/wh_..*", "/v1/webhooks/nope/deliveries"):
        for method in ("GET", "DELETE"):
            answer = await gateway.client.request(method, path, headers=alice)
            assert answer.status in (404, 405), (method, path, answer.status)
            if answer.status == 404:
                assert (await answer.json())["error"]["code"] == "not_found"


async def test_ended_deliveries_past_their_retention_are_erased_without_a_trace_and_pending_ones_stay(
        gateway: Gateway) -> None:
    store = WebhookStore(await open_bucket(gateway.bus, WEBHOOKS_BUCKET, scans=True))
    endpoint_id = f"wh_{secrets.token_hex(12)}"
    now = time.time()

    def delivery(status: DeliveryStatus, age_s: float, attempted_age_s: float | None = None) -> WebhookDelivery:
        attempts = [] if attempted_age_s is None else [DeliveryAttempt(
            attempted_at=now - attempted_age_s, status_code=200, duration_ms=3)]
        return WebhookDelivery(id=f"msg_{secrets.token_hex(12)}", endpoint_id=endpoint_id, status=status,
                               event=WebhookEvent(id=f"evt_{secrets.token_hex(8)}", type="batch.completed",
                                                  created_at=int(now - age_s), data=WebhookEventData(id="batch_x")),
                               attempts=attempts, created_at=now - age_s, event_sequence=1)

    # "Old" is older than anything this session's other tests of the module made (a loaded machine runs them
    # minutes apart): the prune counts every endpoint's deliveries.
    old_delivered, old_failed = delivery("delivered", OLD_S, OLD_S), delivery("failed", OLD_S, OLD_S)
    recent, old_pending = delivery("delivered", 5, 5), delivery("pending", OLD_S)
    failed_lately = delivery("failed", OLD_S, 5)  # made long ago, but its last attempt is recent
    for made in (old_delivered, old_failed, recent, old_pending, failed_lately):
        await store.add_delivery(made)

    assert await store.prune(ended_before=now - OLD_S / 2) == 2
    kept = {d.id for d in await store.list_deliveries(endpoint_id)}
    assert kept == {recent.id, old_pending.id, failed_lately.id}
    # Erased, not marked deleted: nothing of theirs is left in the bucket's stream.
    leftovers = await read_subject(store.kv.js, store.kv.stream, f"{store.kv.prefix}delivery.{endpoint_id}.>")
    assert {message.subject.rsplit(".", 1)[1] for message in leftovers} == kept
    assert await store.prune(ended_before=now - OLD_S / 2) == 0



async def test_an_attempt_recorded_while_a_redelivery_is_asked_is_kept_by_both(
        gateway: Gateway, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two writers of one delivery (a user asking for it again, the deliverer recording an attempt between that
    request's read and its write) each change what is stored now: neither overwrites the other's change."""
    store = WebhookStore(await open_bucket(gateway.bus, WEBHOOKS_BUCKET, scans=True))
    endpoint_id, now = f"wh_{secrets.token_hex(12)}", time.time()
    failed = WebhookDelivery(id=f"msg_{secrets.token_hex(12)}", endpoint_id=endpoint_id, status="failed",
                             event=WebhookEvent(id=f"evt_{secrets.token_hex(8)}", type="batch.completed",
                                                created_at=int(now), data=WebhookEventData(id="batch_x")),
                             attempts=[DeliveryAttempt(attempted_at=now, status_code=500, duration_ms=3)],
                             created_at=now, event_sequence=1)
    await store.add_delivery(failed)
    late_attempt = DeliveryAttempt(attempted_at=now + 1, status_code=200, duration_ms=4)
    write = store.kv.update
    interleaved: list[str] = []

    async def another_writer_first(key: str, value: bytes, last: int) -> int:
        if not interleaved:
            interleaved.append(key)
            await store.change_delivery(endpoint_id, failed.id, lambda stored: stored.model_copy(update={
                "attempts": [*stored.attempts, late_attempt], "status": "delivered"}))
        return await write(key, value, last=last)

    monkeypatch.setattr(store.kv, "update", another_writer_first)
    again = await store.change_delivery(endpoint_id, failed.id, lambda stored: None if stored.status == "pending"
                                        else stored.model_copy(update={"status": "pending"}))

    assert interleaved, "the other writer never came between the read and the write"
    assert again is not None and again.status == "pending"
    assert [a.status_code for a in again.attempts] == [500, 200], "the attempt recorded meanwhile was overwritten"
    assert await store.get_delivery(endpoint_id, failed.id) == again
    assert await store.change_delivery(endpoint_id, "msg_" + "0" * 24, lambda stored: stored) is None


def pending_delivery(endpoint_id: str, status: DeliveryStatus = "pending", at: float | None = None) -> WebhookDelivery:
    now = time.time() if at is None else at
    return WebhookDelivery(id=f"msg_{secrets.token_hex(12)}", endpoint_id=endpoint_id, status=status,
                           event=WebhookEvent(id=f"evt_{secrets.token_hex(8)}", type="batch.completed",
                                              created_at=int(now), data=WebhookEventData(id="batch_x")),
                           attempts=[DeliveryAttempt(attempted_at=now, status_code=500, duration_ms=3)]
                           if status != "pending" else [], created_at=now, event_sequence=1)


async def redelivered(store: WebhookStore, delivery: WebhookDelivery) -> None:
    """What `POST …/deliveries/{id}/redeliver` does: pending again, then made due (unless it is due already)."""
    again = await store.change_delivery(delivery.endpoint_id, delivery.id, lambda stored: stored.model_copy(
        update={"status": "pending", "next_attempt_at": time.time()}))
    assert again is not None
    await store.add_delivery(again)


async def attempted_again(store: WebhookStore, delivery: WebhookDelivery, within_s: float = 60) -> bool:
    """Whether the gateway's deliverer attempts the delivery again (its endpoint does not exist: the attempt says so
    and ends it `failed`), which it does only while the delivery is due."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        stored = await store.get_delivery(delivery.endpoint_id, delivery.id)
        if stored is not None and any(attempt.error == "the endpoint was deleted" for attempt in stored.attempts):
            return True
        await asyncio.sleep(0.2)
    return False


async def test_a_redelivery_asked_while_an_attempt_ends_is_still_delivered(
        gateway: Gateway, monkeypatch: pytest.MonkeyPatch) -> None:
    """The attempt records `delivered`, a user asks for the delivery again (it is not pending: made pending, but its
    due entry is still there, so none is made), then the attempt erases the due entry: the delivery must stay due."""
    store = WebhookStore(await open_bucket(gateway.bus, WEBHOOKS_BUCKET, scans=True))
    delivery = pending_delivery(f"wh_{secrets.token_hex(12)}")
    await store.add_delivery(delivery)
    claim = Claim(delivery.id, delivery.endpoint_id)
    assert await store.claim(claim, 60, time.time()) is True
    finish = store.finish

    async def redelivery_first(claimed: Claim) -> None:
        await redelivered(store, delivery)
        await finish(claimed)

    monkeypatch.setattr(store, "finish", redelivery_first)
    attempts = Attempts(GatewaySettings.model_construct(), store, DueQueue(lambda endpoint_id: endpoint_id),
                        None, None)  # type: ignore[arg-type]  # no attempt is made: only its end
    await attempts._end(claim, delivery, DeliveryAttempt(attempted_at=time.time(), status_code=200, duration_ms=3),
                        "delivered")

    assert await attempted_again(store, delivery), "the redelivered delivery was left pending and never due"


async def test_a_delivery_redelivered_while_the_prune_erases_it_is_kept_and_due(
        gateway: Gateway, monkeypatch: pytest.MonkeyPatch) -> None:
    store = WebhookStore(await open_bucket(gateway.bus, WEBHOOKS_BUCKET, scans=True))
    ended = pending_delivery(f"wh_{secrets.token_hex(12)}", "failed", at=time.time() - OLD_S)
    await store.add_delivery(ended)
    erase_now = webhook_store.erase
    interleaved: list[str] = []

    async def redelivery_between_read_and_erase(bucket: Any, key: str, through: int | None = None) -> None:
        if key.startswith("delivery.") and ended.id in key and not interleaved:
            interleaved.append(key)
            await redelivered(store, ended)
        await erase_now(bucket, key, **({} if through is None else {"through": through}))

    monkeypatch.setattr(webhook_store, "erase", redelivery_between_read_and_erase)
    await store.prune(ended_before=time.time() - OLD_S / 2)

    assert interleaved, "the prune never reached the delivery"
    assert await attempted_again(store, ended), "the redelivered delivery was erased"


async def test_no_fact_list_or_poll_reads_every_tenants_endpoints_or_deliveries(
        gateway: Gateway, receiver: Receiver) -> None:
    """The intake looks a fact's receivers up by its owner and organisation, a list and a create the caller's own
    endpoints, and a poll for due deliveries its gateway's queue: however many endpoints and deliveries other tenants
    have, neither the endpoint keys nor the due entries are ever listed (one read of the newest endpoint write,
    whoever's, keeps a lookup exact)."""
    store = WebhookStore(await open_bucket(gateway.bus, WEBHOOKS_BUCKET))
    for _ in range(3):
        other = await gateway.new_key()
        for _ in range(20):  # as many as an owner may have
            await register(gateway, other, receiver.url + "?who=other", events=["batch.validated"])
    alice = await gateway.new_key()
    own = await register(gateway, alice, receiver.url + "?who=alice", events=["batch.validated"])
    batch_id = await new_batch(gateway, alice)
    listings: list[bytes] = []

    async def seen(message: Any) -> None:
        if b"next_by_subj" in message.data and (b"endpoint." in message.data or b"due." in message.data):
            listings.append(message.data)
    watching = await gateway.bus.nc.subscribe(f"$JS.API.DIRECT.GET.{store.kv.stream}.>", cb=seen)
    plain = await gateway.bus.nc.subscribe(f"$JS.API.DIRECT.GET.{store.kv.stream}", cb=seen)
    try:
        await publish(gateway, validated(batch_id))
        await until(lambda: len(receiver.bodies_for(batch_id)) == 1, "alice's webhook")
        second = await register(gateway, alice, receiver.url + "?who=alice2", events=["batch.validated"])
        listed = (await (await gateway.client.get("/v1/webhooks", headers=alice)).json())["data"]
        await asyncio.sleep(0.5)
    finally:
        await watching.unsubscribe()
        await plain.unsubscribe()
    assert len(await deliveries(gateway, alice, own["id"])) == 1
    assert {endpoint["id"] for endpoint in listed} == {own["id"], second["id"]} and len(listed) == 2
    assert listings == []


async def test_an_attempt_that_outlived_its_lease_leaves_the_next_claim_as_it_is(gateway: Gateway) -> None:
    """Two gateways: the first's attempt runs past its lease, the second claims the delivery meanwhile; the first's
    reschedule must not put the delivery due again over the second's lease (it would be sent twice at once)."""
    bucket = await open_bucket(gateway.bus, WEBHOOKS_BUCKET, scans=True)
    slow, other = WebhookStore(bucket), WebhookStore(bucket)
    delivery = pending_delivery(f"wh_{secrets.token_hex(12)}")
    await slow.add_delivery(delivery)
    claim, now = Claim(delivery.id, delivery.endpoint_id), time.time()
    assert await slow.claim(claim, 1, now) is True
    assert await other.claim(claim, 600, now + 2) is True  # the first lease ran out
    await slow.reschedule(claim, now + 3)
    assert await WebhookStore(bucket).claim(claim, 60, now + 4) is False, "the second lease was overwritten"
    await other.reschedule(claim, now + 5)  # the holder's own reschedule still takes
    assert await WebhookStore(bucket).claim(claim, 60, now + 6) is True
