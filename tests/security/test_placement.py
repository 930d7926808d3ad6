"""Attack (issue 27, point 6): a plain user of one organisation registers a provider, makes a worker key, joins
the broker as an executor that advertises itself as the best place for every batch, and waits for another
organisation's batch and a presigned URL to its input. An unapproved provider must get neither, only its own
organisation's batches; and a batch limited to its own organisation never goes to another's provider, approved
or not."""

import asyncio
import contextlib
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx2
import pytest
from nats.aio.client import Client

from contracts.commands import AdvertReceipt, AdvertUpdate, ExecutorRegistration, RegistrationAnswer
from contracts.events.executor import GUEST_ATTEMPTS, DeviceMemory, ExecutorAdvert
from contracts.objects import ObjectGrant, ObjectRequest
from contracts.subjects import advert_updates, fleet_registrations, input_object_key, object_requests
from tests.security.conftest import ADMIN_KEY, RunningStack
from tests.security.test_tenant_files import attackers_worker_key, join_as_executor, victims_batch

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
MODEL = "smollm2-135m-instruct-q4_1"
SETTLES_WITHIN_S = 120.0
"""What must happen (an assignment, a waiting reason) happens within this on a loaded machine."""


def member_of_new_organization(stack: RunningStack, name: str) -> str:
    """A key of a new user in a new organisation of their own."""
    organization_id, user_id = f"{name}-{secrets.token_hex(3)}", f"{name}-u-{secrets.token_hex(3)}"
    with httpx2.Client(base_url=stack.base_url, headers=ADMIN, timeout=30) as http:
        assert http.post("/organization/organizations", json={"id": organization_id}).status_code == 200
        made = http.post("/organization/users", json={"id": user_id, "organization_id": organization_id})
        assert made.status_code == 200, made.text
        key = http.post("/organization/keys", json={"user_id": user_id})
        assert key.status_code == 200, key.text
        return str(key.json()["value"])


def batch_of(stack: RunningStack, key: str, batch_id: str) -> dict[str, Any]:
    answer = httpx2.get(f"{stack.base_url}/batches/{batch_id}", headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def ran_on(batch: dict[str, Any]) -> set[str]:
    return {attempt["executor_id"] for attempt in batch.get("attempts") or []}


async def until(what: str, check: Callable[[], Awaitable[bool]]) -> None:
    deadline = time.monotonic() + SETTLES_WITHIN_S
    while not await check():
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.5)


def advert(executor_id: str) -> ExecutorAdvert:
    """The most attractive executor there is: the model loaded, nothing to spare (best fit first), many places."""
    return ExecutorAdvert(executor_id=executor_id, engine="llamacpp", engine_version="9", models=[MODEL],
                          loaded_models=[MODEL], devices=[DeviceMemory(name="gpu", total_bytes=1, free_bytes=0)],
                          slots=64, heartbeat_at=int(time.time() * 1000), parallel_attempts=64,
                          guest_attempts=GUEST_ATTEMPTS)


async def heartbeat(evil: Client, executor_id: str) -> None:
    """Its advert, written as an admitted executor has it written: handed to a scheduler for its own key."""
    while True:
        update = AdvertUpdate(advert=advert(executor_id)).model_dump_json().encode()
        assert AdvertReceipt.model_validate_json((await evil.request(advert_updates(executor_id), update,
                                                                     timeout=5)).data).stored
        await asyncio.sleep(2.0)


async def register(evil: Client, executor_id: str, worker_key: str) -> None:
    request = ExecutorRegistration(executor_id=executor_id, worker_key=worker_key, advert=advert(executor_id))
    for _ in range(60):
        reply = await evil.request(fleet_registrations(executor_id), request.model_dump_json().encode(), timeout=5)
        answer = RegistrationAnswer.model_validate_json(reply.data)
        if answer.accepted:
            return
        assert answer.retry, answer.reason
        await asyncio.sleep(1.0)
    raise AssertionError("the attacker's executor was never registered")


async def grant(evil: Client, executor_id: str, batch_id: str, file_id: str) -> ObjectGrant:
    request = ObjectRequest(operation="get", batch_id=batch_id, key=input_object_key(file_id))
    reply = await evil.request(object_requests(executor_id), request.model_dump_json().encode(), timeout=10)
    return ObjectGrant.model_validate_json(reply.data)


@pytest.mark.timeout(400)
async def test_an_unapproved_providers_executor_gets_only_its_own_organisations_batches_and_their_objects(
        secure_stack: RunningStack) -> None:
    attacker_key, victim_key = (member_of_new_organization(secure_stack, name) for name in ("acme", "globex"))
    worker_key = attackers_worker_key(secure_stack, attacker_key)
    executor_id = f"evil-{secrets.token_hex(3)}"
    evil = await join_as_executor(secure_stack, executor_id, worker_key, [])
    beating = asyncio.create_task(heartbeat(evil, executor_id))
    try:
        await register(evil, executor_id, worker_key)
        victim_file, victim_batch = victims_batch(secure_stack, victim_key)
        own_file, own_batch = victims_batch(secure_stack, attacker_key)

        # Its own organisation's batch comes to it; the other organisation's goes to the platform's executor.
        await until("the attacker's own batch assigned to it",
                    lambda: asyncio.to_thread(lambda: executor_id in ran_on(batch_of(secure_stack, attacker_key,
                                                                                     own_batch))))
        await until("the victim's batch assigned", lambda: asyncio.to_thread(
            lambda: bool(ran_on(batch_of(secure_stack, victim_key, victim_batch)))))
        assert executor_id not in ran_on(batch_of(secure_stack, victim_key, victim_batch))

        # The object broker signs its own batch's input for it, and never the victim's.
        assert (await grant(evil, executor_id, own_batch, own_file)).granted
        refused = await grant(evil, executor_id, victim_batch, victim_file)
        assert not refused.granted and refused.url is None

        # Approved by the platform's admin, it still never gets a batch limited to another organisation.
        provider_id = httpx2.get(f"{secure_stack.base_url}/provider/providers", timeout=30,
                                 headers={"Authorization": f"Bearer {attacker_key}"}).json()["data"][0]["id"]
        approved = httpx2.post(f"{secure_stack.base_url}/provider/providers/{provider_id}/approve", headers=ADMIN,
                               timeout=30)
        assert approved.status_code == 200 and approved.json()["status"] == "approved", approved.text
        client = secure_stack.client(victim_key)
        limited = client.batches.create(input_file_id=victim_file, endpoint="/v1/chat/completions",
                                        completion_window="24h", extra_body={"placement": "own_organization"})

        def limited_waits() -> bool:
            shown = batch_of(secure_stack, victim_key, limited.id)
            assert not ran_on(shown), shown
            return "own_organization" in (shown.get("status_reason") or "")

        await until("the limited batch waits for its own organisation's providers",
                    lambda: asyncio.to_thread(limited_waits))
        assert (shown := batch_of(secure_stack, victim_key, limited.id))["placement"] == "own_organization"
        assert not ran_on(shown)
        client.batches.cancel(limited.id)
        secure_stack.client(attacker_key).batches.cancel(own_batch)
    finally:
        beating.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beating
        await evil.close()
