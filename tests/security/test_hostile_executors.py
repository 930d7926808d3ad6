"""Attacks (issue 27) of a self-registered provider's executor on the fleet itself: take over another provider's
executor id, register under an id it was not admitted as, state times from the future, hold several ids with one key,
write garbage or another executor's id into its advert, register in a loop, and end a batch it never ran. Each must
fail while the victims' batches run on, every line once."""

import asyncio
import io
import json
import secrets
import time

import nats
import nats.errors
import nats.js.errors
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from contracts.commands import AdvertReceipt, AdvertUpdate, ExecutorRegistration, RegistrationAnswer
from contracts.events.executor import ExecutorAdvert, ExecutorRegistered
from contracts.permissions import executor_inbox
from contracts.subjects import (
    ACK_SUBJECT_HEADER,
    EVENTS_STREAM,
    EXECUTORS_BUCKET,
    WORK_STREAM,
    admission_asks,
    advert_updates,
    event_subject,
    executor_acks,
    executor_durable,
    executor_finalize_durable,
    executor_pulls,
    fleet_registrations,
)
from services.runtime.nats.leader import HOLDER
from tests.e2e.load import core_nats_url
from tests.security.conftest import RunningStack
from tests.security.test_tenant_files import attackers_worker_key, join_as_executor, user_key, violated

STACK_EXECUTOR = "local-0"
"""The executor `sheshnag up` runs, joined with the operator's worker key."""
TEN_YEARS_MS = 10 * 365 * 24 * 3600 * 1000


def advert(executor_id: str, models: list[str] | None = None, heartbeat_at: int | None = None) -> ExecutorAdvert:
    return ExecutorAdvert(executor_id=executor_id, engine="llamacpp", engine_version="0", models=models or [],
                          loaded_models=[], devices=[], slots=1,
                          heartbeat_at=heartbeat_at if heartbeat_at is not None else int(time.time() * 1000))


async def register(client: Client, subject_id: str, worker_key: str, body: ExecutorAdvert,
                   body_id: str | None = None) -> RegistrationAnswer:
    """Ask on `subject_id`'s registration subject, naming `body_id` (default: the same) in the body; asked again
    while the scheduler says it is still reading the log or does not answer yet."""
    request = ExecutorRegistration(executor_id=body_id or subject_id, worker_key=worker_key, advert=body)
    deadline = time.monotonic() + 60
    while True:
        try:
            reply = await client.request(fleet_registrations(subject_id), request.model_dump_json().encode(),
                                         timeout=5)
            answer = RegistrationAnswer.model_validate_json(reply.data)
            if not answer.retry:
                return answer
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
            pass
        assert time.monotonic() < deadline, "the scheduler never answered the registration"
        await asyncio.sleep(0.5)


async def refused_connection(stack: RunningStack, executor_id: str, worker_key: str) -> bool:
    """Whether the broker refuses this executor id with this key (one try, no reconnects)."""
    client = Client()
    try:
        await client.connect(stack.nats_url(), user=executor_id, password=worker_key, allow_reconnect=False,
                             max_reconnect_attempts=0, inbox_prefix=executor_inbox(executor_id), connect_timeout=10)
    except (nats.errors.Error, OSError):
        return True
    await client.close()
    return False


async def registered(stack: RunningStack, executor_id: str, within_s: float = 120) -> None:
    """Wait until `executor_id` has registered (the stack's own executor joins moments after the gateway is up):
    an id is its first registrant's, so an attack on it means something only once it is taken."""
    connection = await nats.connect(core_nats_url(stack))
    try:
        subject = event_subject("executor", executor_id, ExecutorRegistered.name)
        deadline = time.monotonic() + within_s
        while True:
            try:
                await connection.jetstream().get_last_msg(EVENTS_STREAM, subject)
                return
            except nats.js.errors.NotFoundError:
                assert time.monotonic() < deadline, f"executor {executor_id} never registered"
                await asyncio.sleep(0.5)
    finally:
        await connection.close()


def run_batch(stack: RunningStack, key: str, lines: int, hold: bool = False) -> str:
    client = stack.client(key)
    body = "".join(json.dumps({"custom_id": f"v-{i}", "method": "POST", "url": "/v1/chat/completions",
                               "body": {"model": "smollm2", "max_tokens": 4,
                                        "messages": [{"role": "user", "content": f"Say {i}."}]}}) + "\n"
                   for i in range(lines))
    uploaded = client.files.create(file=("victim.jsonl", io.BytesIO(body.encode())), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h", extra_body={"hold": hold} if hold else None)
    return batch.id


async def ended(stack: RunningStack, key: str, batch_id: str, within_s: float = 240) -> str:
    client = stack.client(key)
    deadline = time.monotonic() + within_s
    while (status := (await asyncio.to_thread(client.batches.retrieve, batch_id)).status) not in (
            "completed", "failed", "cancelled", "expired"):
        assert time.monotonic() < deadline, f"batch {batch_id} still {status}"
        await asyncio.sleep(1)
    return status


def custom_ids(stack: RunningStack, key: str, file_id: str | None) -> list[str]:
    if file_id is None:
        return []
    text = stack.client(key).files.content(file_id).text
    return [json.loads(line)["custom_id"] for line in text.splitlines() if line.strip()]


@pytest.mark.timeout(420)
async def test_a_provider_cannot_take_over_fake_or_multiply_executor_ids_nor_stop_the_scheduler(
        secure_stack: RunningStack) -> None:
    stack = secure_stack
    attacker = user_key(stack)
    worker_key = attackers_worker_key(stack, attacker)
    victim = user_key(stack)

    # 1, 2. Another provider's executor id: the broker does not admit the attacker's key under it.
    await registered(stack, STACK_EXECUTOR)
    assert await refused_connection(stack, STACK_EXECUTOR, worker_key)

    errors: list[str] = []
    own_id, second_id = f"evil-{secrets.token_hex(3)}", f"evil2-{secrets.token_hex(3)}"
    evil = await join_as_executor(stack, own_id, worker_key, errors)
    second: Client | None = None
    try:
        # Registration travels on the connection's own subject: another id's is not its to publish on ...
        await evil.publish(fleet_registrations(STACK_EXECUTOR), b"{}")
        await violated(errors, fleet_registrations(STACK_EXECUTOR))
        # ... and a body naming another id on its own subject is refused.
        answer = await register(evil, own_id, worker_key, advert(STACK_EXECUTOR), body_id=STACK_EXECUTOR)
        assert not answer.accepted and "registers only that id" in (answer.reason or "")
        # 3. Its own id with a heartbeat ten years ahead: admitted, its times clamped to the scheduler's clock.
        answer = await register(evil, own_id, worker_key, advert(own_id, heartbeat_at=int(time.time() * 1000)
                                                                 + TEN_YEARS_MS))
        assert answer.accepted, answer.reason
        # 9. Registering again and again: told to retry, not each stored (a registration is a fact kept for good).
        again = ExecutorRegistration(executor_id=own_id, worker_key=worker_key, advert=advert(own_id))
        answers = [RegistrationAnswer.model_validate_json((await evil.request(
            fleet_registrations(own_id), again.model_dump_json().encode(), timeout=5)).data) for _ in range(5)]
        assert sum(answer.accepted for answer in answers) <= 1 and any(answer.retry for answer in answers), answers
        # 8. The same key under a second id while the first is live: admitted by the broker (unregistered ids are
        # nobody's yet), but its registration is refused.
        second = await join_as_executor(stack, second_id, worker_key, errors)
        answer = await register(second, second_id, worker_key, advert(second_id))
        assert not answer.accepted and "needs a worker key of its own" in (answer.reason or "")

        # 5, 7. Garbage and another executor's id in its own advert, over and over, while a victim's batch runs.
        hostile = [b"{}", b"not json", b'{"advert": ' + advert(STACK_EXECUTOR, models=["smollm2-135m-instruct-q4_1"])
                   .model_dump_json().encode() + b"}", b'{"advert": {"executor_id": "' + own_id.encode()
                   + b'", "slots": -1}}', b'{"advert": null}']
        stop = asyncio.Event()

        async def flood() -> None:
            while not stop.is_set():
                for value in hostile:
                    await evil.publish(advert_updates(own_id), value, reply=f"{executor_inbox(own_id)}.flood")
                await asyncio.sleep(0.1)

        flooding = asyncio.create_task(flood())
        try:
            batch_id = await asyncio.to_thread(run_batch, stack, victim, 6)
            assert await ended(stack, victim, batch_id) == "completed"
            overview = await asyncio.to_thread(stack.client().get, "/organization/overview", cast_to=object)
        finally:
            stop.set()
            await flooding
        batch = stack.client(victim).batches.retrieve(batch_id)
        assert sorted(custom_ids(stack, victim, batch.output_file_id)) == [f"v-{i}" for i in range(6)]
        listed = [executor["executor_id"] for executor in overview["executors"]]  # type: ignore[index]
        assert listed.count(STACK_EXECUTOR) == 1, listed
        assert not [line for line in stack.log("scheduler").splitlines() if "Traceback" in line]
    finally:
        await evil.close()
        if second is not None:
            await second.close()


@pytest.mark.timeout(300)
async def test_a_batch_that_never_ran_is_finalized_by_the_control_plane_not_by_an_idle_executor(
        secure_stack: RunningStack) -> None:
    stack = secure_stack
    attacker = user_key(stack)
    worker_key = attackers_worker_key(stack, attacker)
    victim = user_key(stack)
    errors: list[str] = []
    # The lowest id there is, serving no model: before, it was the fallback finalizer of every batch.
    lowest = "-"
    evil = await join_as_executor(stack, lowest, worker_key, errors)
    try:
        assert (await register(evil, lowest, worker_key, advert(lowest))).accepted
        js = evil.jetstream(timeout=5, prefix=executor_pulls(lowest))
        # Its registration made its durables: it pulls from its finalize durable as its executor would.
        finalize_commands = await js.pull_subscribe_bind(executor_finalize_durable(lowest), WORK_STREAM)

        held = await asyncio.to_thread(run_batch, stack, victim, 5, True)
        client = stack.client(victim)
        deadline = time.monotonic() + 120
        while client.batches.retrieve(held).status == "validating":
            assert time.monotonic() < deadline
            await asyncio.sleep(0.5)
        client.batches.cancel(held)
        assert await ended(stack, victim, held) == "cancelled"
        batch = client.batches.retrieve(held)
        assert sorted(custom_ids(stack, victim, batch.error_file_id)) == [f"v-{i}" for i in range(5)]
        assert batch.request_counts is not None and batch.request_counts.failed == 5
        with pytest.raises(nats.errors.TimeoutError):
            await finalize_commands.fetch(1, timeout=2)
    finally:
        await evil.close()


@pytest.mark.timeout(240)
async def test_a_connection_squatting_an_unregistered_id_is_closed_once_its_owner_registers_it(
        secure_stack: RunningStack) -> None:
    stack = secure_stack
    attackers_key = attackers_worker_key(stack, user_key(stack))
    owners_key = attackers_worker_key(stack, user_key(stack))  # an honest provider of another user
    executor_id = f"gpu-{secrets.token_hex(3)}"
    errors: list[str] = []
    # Nobody's id yet: the broker admits the attacker under it (it may be a new host of its own) ...
    squatter = await join_as_executor(stack, executor_id, attackers_key, errors)
    owner = await join_as_executor(stack, executor_id, owners_key, errors)
    try:
        # ... until the owner registers it: then the squatter's connection is closed, and it is not let back in.
        assert (await register(owner, executor_id, owners_key, advert(executor_id))).accepted
        deadline = time.monotonic() + 30
        while not squatter.is_closed:
            assert time.monotonic() < deadline, "the squatter's connection is still open"
            await asyncio.sleep(0.2)
        assert owner.is_connected
        assert await refused_connection(stack, executor_id, attackers_key)
    finally:
        await squatter.close()
        await owner.close()


@pytest.mark.timeout(240)
async def test_an_executors_request_cannot_have_the_scheduler_answer_on_a_subject_of_its_choosing(
        secure_stack: RunningStack) -> None:
    """A request may name any reply subject, and the scheduler answers with the core user's rights: on the leader
    lease's key (the scheduler loses its lease), into the event log or another executor's commands. Only the asking
    executor's own inbox is answered."""
    stack = secure_stack
    executor_id = f"evil-{secrets.token_hex(3)}"
    evil = await join_as_executor(stack, executor_id, attackers_worker_key(stack, user_key(stack)), [])
    core = await nats.connect(core_nats_url(stack))
    targets = {"lease": "$KV.sheshnag_leader.scheduler", "log": f"evt.batch.batch_{secrets.token_hex(4)}.completed",
               "work": f"cmd.executor.{STACK_EXECUTOR}.run", "read model": "$KV.sheshnag_read.batch.injected"}
    published: list[str] = []
    answers = (b'{"status"', b'{"granted"', b'{"accepted"')  # a desk's, the object broker's, a registration's

    async def seen(message: Msg) -> None:
        # The lease's own renewals and the stack's commands go there too: only an answer's body is a published answer.
        if message.data.startswith(answers):
            published.append(f"{message.subject}: {message.data[:80]!r}")

    watch = [await core.subscribe(subject, cb=seen) for subject in targets.values()]
    try:
        await core.flush()
        lease = await (await core.jetstream().key_value("sheshnag_leader")).get("scheduler")
        asks = [(f"svc.log.{executor_id}", b'{"batch_id": "x"}'), (f"svc.facts.{executor_id}", b'{"event": "{}"}'),
                (f"svc.objects.{executor_id}", b"{}"), (fleet_registrations(executor_id), b"{}")]
        # The desk answers its own executor (the scheduler is leading), then each misdirected request goes unanswered.
        await evil.request(asks[0][0], asks[0][1], timeout=30)
        for subject, body in asks:
            for target in targets.values():
                await evil.publish(subject, body, reply=target)
        await evil.flush()
        await asyncio.sleep(2.0)
        assert published == []
        after = await (await core.jetstream().key_value("sheshnag_leader")).get("scheduler")
        assert after.value == lease.value  # renewed by its holder at most
        assert (await evil.request(asks[0][0], asks[0][1], timeout=5)).data  # still answered where it should be
    finally:
        for subscription in watch:
            await subscription.unsubscribe()
        await core.close()
        await evil.close()


@pytest.mark.timeout(240)
async def test_an_executor_cannot_have_jetstream_or_the_server_answer_on_a_subject_of_its_choosing(
        secure_stack: RunningStack) -> None:
    """nats-server answers a JetStream request (a pull, an ack, a KV put) or a `$SYS` request on whatever reply
    subject it names, with the account's rights (nats-server#8274): before, an executor's pull or heartbeat wrote a
    status, a PubAck or its own commands onto the leader lease, the event log or the read model. Now it may ask the
    server nothing itself, and a scheduler relays its own durables' pulls and acks only when answered on its inbox."""
    stack = secure_stack
    executor_id = f"evil-{secrets.token_hex(3)}"
    worker_key = attackers_worker_key(stack, user_key(stack))
    errors: list[str] = []
    evil = await join_as_executor(stack, executor_id, worker_key, errors)
    core = await nats.connect(core_nats_url(stack))
    anything = {"log": f"evt.batch.batch_{secrets.token_hex(4)}.completed",
                "revocation": f"evt.key.key_{secrets.token_hex(4)}.revoked",
                "read model": "$KV.sheshnag_read.batch.injected"}
    lease_key = "$KV.sheshnag_leader.scheduler"
    landed: list[str] = []

    async def seen(message: Msg) -> None:
        if message.subject != lease_key or not HOLDER.fullmatch(message.data.decode(errors="replace")):  # no renewal
            landed.append(f"{message.subject}: {message.headers} {message.data[:80]!r}")

    watch = [await core.subscribe(subject, cb=seen) for subject in (*anything.values(), lease_key)]
    try:
        assert (await register(evil, executor_id, worker_key, advert(executor_id))).accepted  # its durables exist
        pull = f"{executor_pulls(executor_id)}.CONSUMER.MSG.NEXT.{WORK_STREAM}.{executor_durable(executor_id)}"
        ack = f"$JS.ACK.{WORK_STREAM}.{executor_durable(executor_id)}.1.1.1.1.0"
        # Asked with its own inbox for reply, each is answered (an empty durable's pull: a 404 status).
        answered = await evil.request(pull, b'{"batch": 1, "no_wait": true}', timeout=10)
        assert answered.headers and answered.headers.get("Status") == "404"
        stored = await evil.request(advert_updates(executor_id), AdvertUpdate(advert=advert(executor_id))
                                    .model_dump_json().encode(), timeout=10)
        assert AdvertReceipt.model_validate_json(stored.data).stored
        lease = await (await core.jetstream().key_value("sheshnag_leader")).get("scheduler")

        relayed = [(pull, b'{"batch": 1, "no_wait": true}', None), (executor_acks(executor_id), b"+ACK", ack),
                   (advert_updates(executor_id), AdvertUpdate(advert=advert(executor_id)).model_dump_json().encode(),
                    None), (admission_asks(executor_id), b"{}", None)]
        for target in (*anything.values(), lease_key, f"{executor_inbox('local-0')}.x"):
            for subject, body, acked in relayed:
                headers = {ACK_SUBJECT_HEADER: acked} if acked else None
                await evil.publish(subject, body, reply=target, headers=headers)
        # JetStream and the server themselves it may not ask at all: they would answer wherever it says.
        for subject in (f"$JS.API.CONSUMER.MSG.NEXT.{WORK_STREAM}.{executor_durable(executor_id)}", ack,
                        f"$KV.{EXECUTORS_BUCKET}.{executor_id}", "$SYS.REQ.USER.INFO"):
            await evil.publish(subject, b"{}", reply=anything["log"])
            await violated(errors, subject)
        await evil.flush()
        await asyncio.sleep(2.0)
        assert landed == []
        after = await (await core.jetstream().key_value("sheshnag_leader")).get("scheduler")
        assert after.value == lease.value  # renewed by its holder at most
    finally:
        for subscription in watch:
            await subscription.unsubscribe()
        await core.close()
        await evil.close()
