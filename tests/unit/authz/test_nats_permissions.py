"""The executor's NATS permission set and the nkey JWTs that carry it, without a server."""

import base64
import json
import typing

import nacl.signing
import pytest

from contracts.events.registry import AnyEvent
from contracts.fact_desk import ATTEMPT_FACTS, EXECUTION_FACTS, FINALIZER_FACTS
from contracts.permissions import executor_inbox, executor_permissions
from services.authz import nkey_jwt


def matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: `*` is one token, `>` one or more at the end."""
    wanted, given = pattern.split("."), subject.split(".")
    for index, token in enumerate(wanted):
        if token == ">":
            return len(given) > index
        if index >= len(given) or (token != "*" and token != given[index]):
            return False
    return len(wanted) == len(given)


def allowed(subject: str, executor_id: str = "alpha") -> bool:
    return any(matches(pattern, subject) for pattern in executor_permissions(executor_id).publish)


def event_types() -> set[str]:
    union = typing.get_args(AnyEvent)[0]
    return {typing.get_args(member.model_fields["type"].annotation)[0] for member in typing.get_args(union)}


@pytest.mark.parametrize("subject", [
    "cmd.executor.alpha.run", "cmd.executor.bravo.run", "cmd.finalize", "$KV.sheshnag_executors.bravo",
    "$JS.API.CONSUMER.MSG.NEXT.WORK.executor-bravo", "$JS.API.CONSUMER.CREATE.WORK.executor-alpha.cmd.>",
    "$JS.API.CONSUMER.CREATE.EVENTS", "$JS.API.CONSUMER.CREATE.EVENTS.executor-alpha-read-0.evt.key.>",
    "$JS.API.CONSUMER.MSG.NEXT.EVENTS.ledger", "$JS.API.CONSUMER.DURABLE.CREATE.WORK.executor-alpha",
    "$JS.API.STREAM.INFO.KV_sheshnag_read", "$JS.API.STREAM.CREATE.EVENTS", "$KV.sheshnag_read.apikey.x",
    "evt.key.k.created", "evt.user.u.created", "evt.batch.b.created", "evt.batch.b.assigned", "evt.file.f.deleted",
    "evt.executor.bravo.registered", "$SYS.REQ.USER.AUTH",
    # The event log is the fact desk's: no executor reads or writes it itself, whoever's batch it is.
    "$JS.API.CONSUMER.CREATE.EVENTS.executor-alpha-read-15.evt.batch.batch_1.>", "$JS.API.DIRECT.GET.EVENTS",
    "$JS.API.STREAM.MSG.GET.EVENTS", "evt.batch.b.progressed", "evt.batch.b.completed", "evt.file.f.stored",
    "svc.facts.bravo", "svc.log.bravo", "svc.objects.bravo", "evt.executor.alpha.lost",
    # Another executor's finalize commands, and the shared durable that any executor once took them from.
    "cmd.executor.alpha.finalize", "cmd.executor.bravo.finalize", "$JS.API.CONSUMER.MSG.NEXT.WORK.finalizer-bravo",
    "$JS.API.CONSUMER.CREATE.WORK.finalizer-bravo.cmd.executor.bravo.finalize",
    "$JS.API.CONSUMER.CREATE.WORK.finalizer-alpha.cmd.executor.bravo.finalize",
    "$JS.API.CONSUMER.CREATE.WORK.finalizer-alpha.cmd.executor.*.finalize", "$JS.ACK.WORK.finalizer-bravo.1.2.3.4.5",
    "$JS.API.CONSUMER.CREATE.WORK.finalizers.cmd.finalize", "$JS.API.CONSUMER.MSG.NEXT.WORK.finalizers",
    "$JS.ACK.WORK.finalizers.1.2.3.4.5",
    # Nothing that lists or describes a stream, bucket or consumer: their info names other tenants and executors.
    "$JS.API.STREAM.INFO.EVENTS", "$JS.API.STREAM.INFO.WORK", "$JS.API.STREAM.INFO.KV_sheshnag_executors",
    "$JS.API.STREAM.NAMES", "$JS.API.STREAM.LIST", "$JS.API.INFO", "$JS.API.CONSUMER.LIST.WORK",
    "$JS.API.CONSUMER.NAMES.WORK", "$JS.API.CONSUMER.INFO.WORK.executor-alpha",
    "$JS.API.DIRECT.GET.KV_sheshnag_executors", "$JS.API.CONSUMER.CREATE.KV_sheshnag_executors",
    # Not even its own durables: the scheduler makes them when it accepts the registration (made by the executor, they
    # could be made under ids never registered, or shaped to lock their owner out).
    "$JS.API.CONSUMER.CREATE.WORK.executor-alpha.cmd.executor.alpha.run",
    "$JS.API.CONSUMER.CREATE.WORK.finalizer-alpha.cmd.executor.alpha.finalize"])
def test_an_executor_may_not_publish_to_what_is_not_its_own(subject: str) -> None:
    assert not allowed(subject)


@pytest.mark.parametrize("subject", [
    "svc.register.alpha", "svc.advert.alpha", "svc.js.alpha.CONSUMER.MSG.NEXT.WORK.executor-alpha",
    "svc.js.alpha.CONSUMER.MSG.NEXT.WORK.finalizer-alpha", "svc.ack.alpha", "svc.admission.alpha",
    "svc.facts.alpha", "svc.log.alpha", "svc.objects.alpha"])
def test_an_executor_may_publish_what_its_job_needs(subject: str) -> None:
    assert allowed(subject)


@pytest.mark.parametrize("subject", [
    "$JS.API.CONSUMER.MSG.NEXT.WORK.executor-alpha", "$JS.API.CONSUMER.MSG.NEXT.WORK.finalizer-alpha",
    "$JS.ACK.WORK.executor-alpha.1.2.3.4.5", "$JS.ACK.WORK.finalizer-alpha.1.2.3.4.5", "$KV.sheshnag_executors.alpha",
    "$SYS.REQ.USER.INFO", "$JS.API.CONSUMER.INFO.WORK.executor-alpha", "$JS.FC.WORK.x", "$SYS.REQ.ACCOUNT.PING.CONNZ",
    "svc.js.alpha.CONSUMER.INFO.WORK.executor-alpha", "svc.js.alpha.STREAM.INFO.WORK", "svc.ack.bravo",
    "svc.advert.bravo", "svc.admission.bravo", "svc.js.bravo.CONSUMER.MSG.NEXT.WORK.executor-bravo"])
def test_an_executor_asks_the_server_nothing_itself_not_even_for_its_own(subject: str) -> None:
    """nats-server answers a JetStream or `$SYS` request on any reply subject it names, with the account's rights
    (nats-server#8274): a scheduler relays the executor's own, answered to its own inbox (`services/authz/relay.py`)."""
    assert not allowed(subject)
    assert all(pattern.startswith("svc.") for pattern in executor_permissions("alpha").publish)


@pytest.mark.parametrize("other", ["finalizer-alpha", "alpha-finalize", "executor-alpha", "finalizer"])
def test_no_executor_id_names_another_executors_finalize_durable_as_one_of_its_own(other: str) -> None:
    for pulled in ("finalizer-alpha", "executor-alpha"):
        assert allowed(f"svc.js.alpha.CONSUMER.MSG.NEXT.WORK.{pulled}", "alpha")
        assert not allowed(f"svc.js.{other}.CONSUMER.MSG.NEXT.WORK.{pulled}", other)


def test_an_executor_subscribes_only_under_its_own_inbox() -> None:
    assert executor_permissions("alpha").subscribe == (f"{executor_inbox('alpha')}.>",)
    assert not matches(executor_permissions("alpha").subscribe[0], f"{executor_inbox('bravo')}.reply")


def test_the_facts_the_desk_takes_from_executors_and_shows_them_are_real_event_types() -> None:
    types = event_types()
    assert {f"batch.{fact}" for fact in (*ATTEMPT_FACTS, *FINALIZER_FACTS, *EXECUTION_FACTS)} <= types
    assert "batch.created" not in {f"batch.{fact}" for fact in EXECUTION_FACTS}


def test_a_jwt_is_signed_by_its_issuer_over_header_and_claims() -> None:
    seed = nkey_jwt.new_account_seed()
    token = nkey_jwt.encode({"sub": "UABC", "aud": "$G", "nats": {"type": "user", "version": 2}}, seed)
    header, claims, signature = token.split(".")
    decoded = nkey_jwt.decode(token)
    assert decoded["iss"] == nkey_jwt.public_key(seed) and decoded["iss"].startswith("A")
    assert decoded["sub"] == "UABC" and len(decoded["jti"]) == 52
    assert json.loads(base64.urlsafe_b64decode(header + "==")) == {"typ": "JWT", "alg": "ed25519-nkey"}
    issuer = decoded["iss"]
    raw_public = base64.b32decode(issuer + "=" * (-len(issuer) % 8))[1:33]
    nacl.signing.VerifyKey(raw_public).verify(f"{header}.{claims}".encode(),
                                              base64.urlsafe_b64decode(signature + "=="))


@pytest.mark.parametrize("token", ["", "a.b", "x.y.z", "e30.e30.sig"])
def test_what_is_not_an_nkey_jwt_is_refused(token: str) -> None:
    with pytest.raises(nkey_jwt.MalformedJwt):
        nkey_jwt.decode(token)
