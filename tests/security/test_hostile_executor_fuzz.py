"""Issue 27: every byte an executor writes is untrusted. A self-registered provider's executor sends random and
hostile-but-schema-valid values to every subject its credentials may publish to (`executor_permissions`, read at run
time) for `SHESHNAG_FUZZ_SECONDS`, while a victim tenant's batches run to completion, every line once. No service
crashes or restarts, each still answers, and the attacker is granted nothing of anyone's."""

import asyncio
import collections
import os
import random
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx2
import nats.errors
import pytest
from nats.aio.client import Client

from contracts.commands import ExecutorRegistration, RegistrationAnswer
from contracts.fact_desk import FactReceipt, LogPage, LogRead
from contracts.objects import ObjectGrant, ObjectRequest
from contracts.permissions import executor_permissions
from contracts.subjects import (
    input_object_key,
    log_reads,
    object_requests,
)
from infra.service_names import SERVICES
from tests.security.conftest import ADMIN_KEY, RunningStack
from tests.security.hostile_payloads import Hostile, Kind, Targets, kind_of
from tests.security.test_hostile_executors import STACK_EXECUTOR, advert, custom_ids, ended, register, run_batch
from tests.security.test_tenant_files import attackers_worker_key, join_as_executor, user_key_and_id

FUZZ_SECONDS = float(os.environ.get("SHESHNAG_FUZZ_SECONDS", "20"))
MIN_VICTIM_BATCHES = 2
"""Batches of the victim that must end while the fuzz runs (it runs on past its time until they have)."""
SENDERS = 6
ANSWER_WAIT_S = 3.0
BATCH_WAIT_S = 600.0
CRASH_LINES = ("Traceback", "crashed with exit code")
WATCHED = (*SERVICES, "nats")


@dataclass
class Tally:
    sent: collections.Counter[str] = field(default_factory=collections.Counter)
    answered: collections.Counter[str] = field(default_factory=collections.Counter)
    unanswered: collections.Counter[str] = field(default_factory=collections.Counter)
    outcomes: collections.Counter[str] = field(default_factory=collections.Counter)
    """Each answer's gist (kind, status, the start of its reason): what the services made of the fuzz."""
    breaches: list[str] = field(default_factory=list)
    """Answers that gave the attacker something: a URL, a stored fact, a log page, another id's registration."""


def gist(kind: Kind, status: str, reason: str | None) -> str:
    """An answer's kind, status and the words of its reason without the ids in it (so answers tally by kind)."""
    words = [word for word in (reason or "").split()[:6] if word.isalpha() and len(word) <= 24]
    return f"{kind} {status}: {' '.join(words)}"


def judge(kind: Kind, request: bytes, reply: bytes, targets: Targets, tally: Tally) -> None:
    """Record what the attacker got back; it holds no batch, so every grant or stored fact is a breach."""
    what = f"{kind}: {request[:200]!r} -> {reply[:300]!r}"
    answer: ObjectGrant | FactReceipt | LogPage | RegistrationAnswer
    if kind == "objects":
        answer = ObjectGrant.model_validate_json(reply)
        tally.outcomes[gist(kind, f"granted={answer.granted}", answer.reason)] += 1
        if answer.granted:
            tally.breaches.append(what)
    elif kind == "facts":
        answer = FactReceipt.model_validate_json(reply)
        tally.outcomes[gist(kind, answer.status, answer.reason)] += 1
        if answer.status == "stored":
            tally.breaches.append(what)
    elif kind == "log":
        answer = LogPage.model_validate_json(reply)
        tally.outcomes[gist(kind, answer.status, answer.reason)] += 1
        if any(fact.event for fact in answer.facts):
            tally.breaches.append(what)
    elif kind == "register":
        answer = RegistrationAnswer.model_validate_json(reply)
        tally.outcomes[gist(kind, f"accepted={answer.accepted}", answer.reason)] += 1
        if not answer.accepted:
            return
        try:
            asked = ExecutorRegistration.model_validate_json(request)
        except ValueError:
            tally.breaches.append(what)
            return
        if {asked.executor_id, asked.advert.executor_id} != {targets.executor_id} \
                or asked.worker_key != targets.worker_key:
            tally.breaches.append(what)


class Attacker:
    """The hostile executor's connection, joined again should the broker close it."""

    def __init__(self, stack: RunningStack, targets: Targets) -> None:
        self.stack, self.targets = stack, targets
        self.errors: list[str] = []
        self.client: Client | None = None

    async def connection(self) -> Client:
        if self.client is None or self.client.is_closed:
            self.client = await join_as_executor(self.stack, self.targets.executor_id, self.targets.worker_key,
                                                 self.errors)
        return self.client

    async def send(self, hostile: Hostile, subject: str, tally: Tally) -> None:
        kind = kind_of(subject, self.targets.executor_id)
        payload, concrete = hostile.payload(kind, subject), hostile.concrete(subject)
        tally.sent[subject] += 1
        client = await self.connection()
        try:
            if kind in ("register", "objects", "facts", "log", "user_info"):
                reply = await client.request(concrete, payload, timeout=ANSWER_WAIT_S)
                tally.answered[subject] += 1
                judge(kind, payload, reply.data, self.targets, tally)
            else:
                await client.publish(concrete, payload, reply=client.new_inbox())
                await asyncio.sleep(0.005)
        except nats.errors.Error:  # no answer in time, no responder, a reconnect: the next message goes on
            tally.unanswered[subject] += 1

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()


async def fuzz(attacker: Attacker, seed: int, subjects: list[str], stop: asyncio.Event, tally: Tally) -> None:
    """One sender: its own seeded generator, every permitted subject in turn."""
    hostile = Hostile(random.Random(seed), attacker.targets)
    turn = seed
    while not stop.is_set():
        await attacker.send(hostile, subjects[turn % len(subjects)], tally)
        turn += 1


async def victim_batch(stack: RunningStack, key: str, targets: Targets, rng: random.Random) -> str:
    """One of the victim's batches, from upload to its checked end: completed, every line once."""
    lines = rng.randint(4, 8)
    batch_id = await asyncio.to_thread(run_batch, stack, key, lines)
    batch = await asyncio.to_thread(stack.client(key).batches.retrieve, batch_id)
    targets.batch_ids.append(batch_id)
    targets.file_ids.append(batch.input_file_id)
    assert await ended(stack, key, batch_id, BATCH_WAIT_S) == "completed", batch_id
    batch = await asyncio.to_thread(stack.client(key).batches.retrieve, batch_id)
    for file_id in (batch.output_file_id, batch.error_file_id):
        if file_id is not None:
            targets.file_ids.append(file_id)
    seen = [*await asyncio.to_thread(custom_ids, stack, key, batch.output_file_id),
            *await asyncio.to_thread(custom_ids, stack, key, batch.error_file_id)]
    assert sorted(seen) == sorted(f"v-{i}" for i in range(lines)), (batch_id, seen)
    ran_on = {attempt.get("executor_id") for attempt in batch.model_extra.get("attempts") or []} \
        if batch.model_extra else set()
    assert targets.executor_id not in ran_on, f"{batch_id} ran on the attacker's executor, of another organisation"
    return batch_id


async def victim(stack: RunningStack, key: str, targets: Targets, stop: asyncio.Event, done: list[str]) -> None:
    rng = random.Random(len(targets.batch_ids))
    while not stop.is_set():
        done.append(await victim_batch(stack, key, targets, rng))


def member_of_new_organization(stack: RunningStack, name: str) -> str:
    """A key of a new user in a new organisation of their own: no batch of the victim's may run on its providers."""
    organization_id, user_id = f"{name}-{secrets.token_hex(3)}", f"{name}-u-{secrets.token_hex(3)}"
    with httpx2.Client(base_url=stack.base_url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=30) as http:
        made = http.post("/organization/organizations", json={"id": organization_id})
        assert made.status_code == 200, made.text
        made = http.post("/organization/users", json={"id": user_id, "organization_id": organization_id})
        assert made.status_code == 200, made.text
        key = http.post("/organization/keys", json={"user_id": user_id})
        assert key.status_code == 200, key.text
        return str(key.json()["value"])


def log_sizes(stack: RunningStack) -> dict[str, int]:
    return {name: (stack.data_dir / "logs" / f"{name}.log").stat().st_size for name in WATCHED} | {
        "up": supervisor_output(stack).stat().st_size}


def supervisor_output(stack: RunningStack) -> Path:
    return stack.data_dir.parent / f"up-{stack.port}.out"


def crash_lines_since(stack: RunningStack, sizes: dict[str, int]) -> dict[str, str]:
    """Each watched log's text written since `sizes`, where it holds a traceback or the supervisor's crash line."""
    found = {}
    for name, offset in sizes.items():
        path = supervisor_output(stack) if name == "up" else stack.data_dir / "logs" / f"{name}.log"
        with open(path, "rb") as log:
            log.seek(offset)
            text = log.read().decode(errors="replace")
        if any(line in text for line in CRASH_LINES):
            at = min(text.find(line) for line in CRASH_LINES if line in text)
            found[name] = text[max(at - 2_000, 0):at + 6_000]
    return found


async def still_answers(attacker: Attacker, targets: Targets) -> None:
    """A well-formed request on each of the desk's and the object broker's subjects is answered, and refused."""
    client = await attacker.connection()
    victims_batch, victims_file = targets.batch_ids[-1], targets.file_ids[-1]
    grant = await client.request(object_requests(targets.executor_id), ObjectRequest(
        operation="get", batch_id=victims_batch, key=input_object_key(victims_file)).model_dump_json().encode(),
                                 timeout=30)
    assert not ObjectGrant.model_validate_json(grant.data).granted
    page = await client.request(log_reads(targets.executor_id), LogRead(batch_id=victims_batch)
                                .model_dump_json().encode(), timeout=30)
    assert LogPage.model_validate_json(page.data).status == "refused"


@pytest.mark.timeout(int(FUZZ_SECONDS) + 2_400)
async def test_a_hostile_executor_fuzzing_every_subject_it_may_write_stops_no_service_and_gets_nothing(
        secure_stack: RunningStack) -> None:
    stack, seed = secure_stack, int(os.environ.get("SHESHNAG_FUZZ_SEED") or secrets.randbits(32))
    print(f"fuzz seed {seed} (SHESHNAG_FUZZ_SEED={seed} replays it), {FUZZ_SECONDS:.0f}s")
    victim_key, victim_key_id = user_key_and_id(stack)
    attacker_key = member_of_new_organization(stack, "fuzz")
    executor_id = f"fuzz-{secrets.token_hex(3)}"
    targets = Targets(executor_id, attackers_worker_key(stack, attacker_key), [STACK_EXECUTOR, "-", "evil-1"],
                      key_ids=[victim_key_id])
    subjects = list(executor_permissions(executor_id).publish)
    attacker = Attacker(stack, targets)
    pids = {name: stack.service_pid(name) for name in WATCHED}
    sizes = log_sizes(stack)
    tally = Tally()
    done: list[str] = []
    stop_fuzz, stop_victim = asyncio.Event(), asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    try:
        client = await attacker.connection()
        assert (await register(client, executor_id, targets.worker_key, advert(executor_id))).accepted

        senders = [asyncio.create_task(fuzz(attacker, seed + n, subjects, stop_fuzz, tally)) for n in range(SENDERS)]
        victims = asyncio.create_task(victim(stack, victim_key, targets, stop_victim, done))
        tasks = [*senders, victims]
        started = time.monotonic()
        while time.monotonic() - started < FUZZ_SECONDS or len(done) < MIN_VICTIM_BATCHES:
            for task in tasks:
                if task.done():
                    task.result()  # a victim's batch went wrong, or a service answered outside its contract
            await asyncio.sleep(1)
        stop_victim.set()
        await victims  # the batch in flight ends under the fuzz too
        stop_fuzz.set()
        await asyncio.gather(*senders)
        fuzzed_for = time.monotonic() - started

        # After the fuzz: a new batch still completes (the scheduler schedules), and every answer still comes.
        done.append(await victim_batch(stack, victim_key, targets, random.Random(seed)))
        await still_answers(attacker, targets)
    finally:
        stop_fuzz.set()
        stop_victim.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await attacker.close()

    print(f"fuzzed {fuzzed_for:.0f}s; victim batches completed: {len(done)} (the last after the fuzz)")
    for subject in subjects:
        print(f"  {subject}: sent {tally.sent[subject]}, answered {tally.answered[subject]}, "
              f"unanswered {tally.unanswered[subject]}")
    for outcome, count in sorted(tally.outcomes.items()):
        print(f"  {count:6d}  {outcome}")
    assert all(tally.sent[subject] > 0 for subject in subjects), tally.sent
    assert not tally.breaches, tally.breaches[:5]
    assert {name: stack.service_pid(name) for name in WATCHED} == pids, "a service was restarted"
    for pid in pids.values():
        os.kill(pid, 0)  # still running
    assert not (crashes := crash_lines_since(stack, sizes)), "\n\n".join(f"== {name}\n{text}"
                                                                          for name, text in crashes.items())
    models = httpx2.get(f"{stack.base_url}/models", headers={"Authorization": f"Bearer {victim_key}"}, timeout=30)
    assert models.status_code == 200, models.text
