"""Attack (issue 13, door 1): a plain user registers a provider, makes a worker key, joins the broker as an executor
and tries to take another tenant's file: read the victim's `batch.created` (its input object key), register that
object as a file of its own, and download it with its own API key. Each step must fail."""

import asyncio
import io
import secrets
import time

import httpx2
import nats
import nats.errors
import pytest
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from contracts.events.file import FileStored
from contracts.fact_desk import LogRead
from contracts.ids import output_file_id
from contracts.permissions import executor_inbox
from contracts.subjects import EVENTS_STREAM, batch_events, batch_fact, input_object_key
from services.executor.adapters.desk import FactDesk, FactRefused
from tests.security.conftest import ADMIN_KEY, RunningStack

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
DENIED_WITHIN_S = 2.0
ADMITTED_WITHIN_S = 60.0


def user_key(stack: RunningStack) -> str:
    """A new plain user's API key."""
    return user_key_and_id(stack)[0]


def user_key_and_id(stack: RunningStack) -> tuple[str, str]:
    """A new plain user's API key, and its id."""
    user_id = f"u-{secrets.token_hex(4)}"
    made = httpx2.post(f"{stack.base_url}/organization/users", json={"id": user_id}, headers=ADMIN, timeout=30)
    assert made.status_code == 200, made.text
    key = httpx2.post(f"{stack.base_url}/organization/keys", json={"user_id": user_id}, headers=ADMIN, timeout=30)
    assert key.status_code == 200, key.text
    return str(key.json()["value"]), str(key.json()["id"])


def victims_batch(stack: RunningStack, key: str) -> tuple[str, str]:
    """The victim's uploaded file and a batch on it: (file id, batch id)."""
    client = stack.client(key)
    line = b'{"custom_id": "secret-1", "method": "POST", "url": "/v1/chat/completions", "body": ' \
           b'{"model": "smollm2", "messages": [{"role": "user", "content": "my secret"}]}}\n'
    uploaded = client.files.create(file=("secret.jsonl", io.BytesIO(line)), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    return uploaded.id, batch.id


def attackers_worker_key(stack: RunningStack, key: str) -> str:
    """The attacker registers a provider with its own user key (any signed-in user may) and makes a worker key."""
    with httpx2.Client(base_url=stack.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
        provider = http.post("/provider/providers", json={"name": f"evil-{secrets.token_hex(3)}"})
        assert provider.status_code == 200, provider.text
        made = http.post(f"/provider/providers/{provider.json()['id']}/worker_keys", json={"name": "evil"})
        assert made.status_code == 200, made.text
        return str(made.json()["value"])


async def join_as_executor(stack: RunningStack, executor_id: str, worker_key: str, errors: list[str]) -> Client:
    async def on_error(problem: Exception) -> None:
        errors.append(str(problem).lower())

    deadline = time.monotonic() + ADMITTED_WITHIN_S
    while True:
        client = Client()
        try:
            await client.connect(stack.nats_url(), user=executor_id, password=worker_key, allow_reconnect=False,
                                 inbox_prefix=executor_inbox(executor_id), error_cb=on_error, connect_timeout=5)
            return client
        except nats.errors.Error:
            await client.close()
            assert time.monotonic() < deadline, "the attacker's worker key was never admitted"
            await asyncio.sleep(0.5)


async def violated(errors: list[str], subject: str) -> None:
    deadline = time.monotonic() + DENIED_WITHIN_S
    while not any("permissions violation" in error and subject.lower() in error for error in errors):
        assert time.monotonic() < deadline, f"no permissions violation for {subject}; saw {errors}"
        await asyncio.sleep(0.05)


@pytest.mark.timeout(240)
async def test_a_users_own_executor_cannot_read_register_or_download_another_tenants_file(
        secure_stack: RunningStack) -> None:
    victim_file, victim_batch = victims_batch(secure_stack, user_key(secure_stack))
    attacker_key, attacker_owner = user_key_and_id(secure_stack)
    executor_id = f"evil-{secrets.token_hex(3)}"
    errors: list[str] = []
    evil = await join_as_executor(secure_stack, executor_id, attackers_worker_key(secure_stack, attacker_key), errors)
    try:
        # 1. Read the victim's batch facts: no consumer, no direct get, no message get on the event log.
        js = evil.jetstream(timeout=DENIED_WITHIN_S)
        for name, wanted in (("executor-evil-read-0", batch_events(victim_batch)), ("x", "evt.batch.>"),
                             ("y", "evt.>")):
            config = ConsumerConfig(name=name, filter_subject=wanted, deliver_policy=DeliverPolicy.ALL,
                                    ack_policy=AckPolicy.NONE)
            with pytest.raises(nats.errors.TimeoutError):
                await js.add_consumer(EVENTS_STREAM, config)
            await violated(errors, f"$JS.API.CONSUMER.CREATE.{EVENTS_STREAM}.{name}.{wanted}")
        with pytest.raises(nats.errors.Error):
            await js.get_last_msg(EVENTS_STREAM, batch_fact(victim_batch, "created"), direct=True)
        with pytest.raises(nats.errors.Error):
            await js.get_last_msg(EVENTS_STREAM, batch_fact(victim_batch, "created"))
        desk = FactDesk(evil, executor_id, wait_s=5)
        with pytest.raises(FactRefused):
            await desk.read(victim_batch, 0)
        read = await evil.request(f"svc.log.{executor_id}", LogRead(batch_id=victim_batch).model_dump_json().encode(),
                                  timeout=5)
        assert b"secret" not in read.data and b"files/" not in read.data

        # 2. Register the victim's object as the attacker's own file: straight into the log, then through the desk.
        stolen_id = f"file-{secrets.token_hex(8)}"
        stolen = FileStored(aggregate_id=stolen_id, owner_key_id=attacker_owner, filename="loot.jsonl",
                            purpose="batch", bytes=100, sha256="0" * 64, object_key=input_object_key(victim_file),
                            created_at=int(time.time()))
        await evil.publish(stolen.subject, stolen.model_dump_json().encode())
        await violated(errors, stolen.subject)
        disguised = [stolen,
                     stolen.model_copy(update={"purpose": "batch_output", "batch_id": victim_batch}),
                     stolen.model_copy(update={"aggregate_id": output_file_id(victim_batch), "purpose": "batch_output",
                                               "batch_id": victim_batch})]
        for forged in disguised:
            with pytest.raises(FactRefused):
                await desk.submit(forged)
    finally:
        await evil.close()

    # 3. Download it with the attacker's own key: there is no such file of theirs.
    await asyncio.sleep(2.0)  # the ledger would have folded a fact that got in by now
    with httpx2.Client(base_url=secure_stack.base_url, timeout=30,
                       headers={"Authorization": f"Bearer {attacker_key}"}) as http:
        for file_id in (stolen_id, output_file_id(victim_batch), victim_file):
            answer = http.get(f"/files/{file_id}/content")
            assert answer.status_code == 404, answer.text
            assert b"my secret" not in answer.content
