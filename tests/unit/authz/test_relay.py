"""The relay of an executor's JetStream requests (`services/authz/relay.py`): only its own durables' pulls and acks go
on, and only ever answered on its own inbox; what JetStream would answer elsewhere is not relayed at all."""

import typing
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
from nats.aio.msg import Msg

from contracts.subjects import ACK_SUBJECT_HEADER
from services.authz.callout import ExecutorAuthority
from services.authz.relay import relay_ack, relay_pull

INBOX = "_INBOX_EXECUTOR.alpha.Xq1.token"


@dataclass
class Published:
    messages: list[tuple[str, bytes, str]] = field(default_factory=list)

    async def publish(self, subject: str, payload: bytes = b"", reply: str = "") -> None:
        self.messages.append((subject, payload, reply))


def authority_over(published: Published) -> ExecutorAuthority:
    return typing.cast(ExecutorAuthority, SimpleNamespace(bus=SimpleNamespace(nc=published)))


def message(subject: str, data: bytes, reply: str, headers: dict[str, str] | None = None) -> Msg:
    return typing.cast(Msg, SimpleNamespace(subject=subject, data=data, reply=reply, headers=headers))


@pytest.mark.parametrize("durable", ["executor-alpha", "finalizer-alpha"])
async def test_an_executors_pull_on_its_own_durable_goes_to_jetstream_answered_on_its_own_inbox(durable: str) -> None:
    published = Published()
    request = b'{"batch": 1, "expires": 5000000000}'
    await relay_pull(authority_over(published),
                     message(f"svc.js.alpha.CONSUMER.MSG.NEXT.WORK.{durable}", request, INBOX))
    assert published.messages == [(f"$JS.API.CONSUMER.MSG.NEXT.WORK.{durable}", request, INBOX)]


@pytest.mark.parametrize(("subject", "reply"), [
    ("svc.js.alpha.CONSUMER.MSG.NEXT.WORK.executor-alpha", "$KV.sheshnag_leader.scheduler"),
    ("svc.js.alpha.CONSUMER.MSG.NEXT.WORK.executor-alpha", "evt.key.key_1.revoked"),
    ("svc.js.alpha.CONSUMER.MSG.NEXT.WORK.executor-alpha", "_INBOX_EXECUTOR.bravo.token"),
    ("svc.js.alpha.CONSUMER.MSG.NEXT.WORK.executor-alpha", "_INBOX_EXECUTOR.alpha"),
    ("svc.js.alpha.CONSUMER.MSG.NEXT.WORK.executor-alpha", ""),
    ("svc.js.alpha.CONSUMER.MSG.NEXT.WORK.executor-bravo", INBOX),
    ("svc.js.alpha.CONSUMER.MSG.NEXT.WORK.finalizer-bravo", INBOX),
    ("svc.js.alpha.CONSUMER.MSG.NEXT.WORK.ledger", INBOX)])
async def test_a_pull_answered_elsewhere_or_on_anothers_durable_is_not_relayed(subject: str, reply: str) -> None:
    published = Published()
    await relay_pull(authority_over(published), message(subject, b"{}", reply))
    assert published.messages == []


ACK = "$JS.ACK.WORK.executor-alpha.1.42.7.1765000000000000000.3"


@pytest.mark.parametrize(("body", "reply"), [
    (b"", ""), (b"+ACK", ""), (b"+ACK", INBOX), (b"-NAK", ""), (b'-NAK {"delay": 2000000000}', ""), (b"+WPI", ""),
    (b"+TERM", "")])
async def test_an_executors_ack_of_its_own_message_goes_on(body: bytes, reply: str) -> None:
    published = Published()
    await relay_ack(authority_over(published), message("svc.ack.alpha", body, reply, {ACK_SUBJECT_HEADER: ACK}))
    assert published.messages == [(ACK, body, reply)]


@pytest.mark.parametrize(("acked", "body", "reply"), [
    (ACK, b"+ACK", "$KV.sheshnag_leader.scheduler"), (ACK, b"+ACK", "evt.batch.batch_1.completed"),
    (ACK, b"+ACK", "_INBOX_EXECUTOR.bravo.x"), (ACK, b"+NXT", INBOX), (ACK, b'{"stream": "EVENTS"}', ""),
    (ACK, b"+ACK\r\nPUB evt.x 1", ""), (ACK.replace("executor-alpha", "executor-bravo"), b"+ACK", ""),
    (ACK.replace("WORK", "EVENTS"), b"+ACK", ""), ("$JS.ACK.WORK.executor-alpha.>", b"+ACK", ""),
    ("$JS.ACK.WORK.executor-alpha.1.2.3.4", b"+ACK", ""), (f"{ACK}.extra", b"+ACK", ""),
    ("$KV.sheshnag_leader.scheduler", b"+ACK", ""), ("", b"+ACK", "")])
async def test_an_ack_of_anything_else_or_answered_elsewhere_is_not_relayed(acked: str, body: bytes,
                                                                            reply: str) -> None:
    published = Published()
    await relay_ack(authority_over(published), message("svc.ack.alpha", body, reply, {ACK_SUBJECT_HEADER: acked}))
    assert published.messages == []


async def test_an_ack_without_its_subject_is_not_relayed() -> None:
    published = Published()
    await relay_ack(authority_over(published), message("svc.ack.alpha", b"+ACK", "", None))
    assert published.messages == []


async def test_a_pull_request_larger_than_any_nats_py_sends_is_not_relayed() -> None:
    published = Published()
    huge = b'{"batch": 1, "padding": "' + b"x" * 2048 + b'"}'
    await relay_pull(authority_over(published),
                     message("svc.js.alpha.CONSUMER.MSG.NEXT.WORK.executor-alpha", huge, INBOX))
    assert published.messages == []
