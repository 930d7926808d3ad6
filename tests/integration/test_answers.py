"""Core request/reply answers declared on a ServiceRouter, against the real broker: a leader-only answer is
subscribed for a term at a time (no responders between terms), a malformed request gets its answer's refusal."""

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated

import nats
import nats.errors
import pytest
from faststream import Context, Path
from faststream.nats import NatsBroker
from nats.aio.msg import Msg
from pydantic import BaseModel

from services.runtime.nats.bus import EventBus
from services.runtime.nats.delivery import Answer, ServiceRouter
from tests.conftest import RunningNats


class Question(BaseModel):
    n: int


class Reply(BaseModel):
    ok: bool
    text: str = ""


@dataclass
class Clerk:
    name: str


def refused(why: str) -> Reply:
    return Reply(ok=False, text=f"Malformed question: {why}")


ASKED = Answer("tests.ask.{who}", Question, refused)
ALWAYS = Answer("tests.always", Question, refused, leader_only=False)
MINE = Answer("tests.mine.{who}", Question, refused, reply_prefix=lambda subject: f"_INBOX_T.{subject.split('.')[-1]}.")


async def ask(question: Question, who: Annotated[str, Path()], term: Annotated[Clerk, Context()]) -> Reply:
    return Reply(ok=True, text=f"{term.name} answers {who}: {question.n + 1}")


async def always(question: Question, clerk: Annotated[Clerk, Context()]) -> Reply:
    return Reply(ok=True, text=f"{clerk.name}: {question.n}")


ANSWERED: list[int] = []


async def mine(question: Question, who: Annotated[str, Path()], term: Annotated[Clerk, Context()]) -> Reply:
    ANSWERED.append(question.n)
    return Reply(ok=True, text=f"to {who}: {question.n}")


@dataclass
class Answering:
    broker: NatsBroker
    router: ServiceRouter
    bus: EventBus


@pytest.fixture
async def answering(nats_server: RunningNats) -> AsyncIterator[Answering]:
    bus = await EventBus.connect(nats_server.url, "tests-answers")
    broker = bus.broker
    router = ServiceRouter("tests", dependencies="clerk")
    router.answers(ASKED, ask, "Answer a question, while leading.")
    router.answers(ALWAYS, always, "Answer a question, always.")
    router.answers(MINE, mine, "Answer a question, to the asker's inbox alone.")
    broker.include_router(router)
    broker.context.set_global("clerk", Clerk("the clerk"))
    await broker.start()
    try:
        yield Answering(broker, router, bus)
    finally:
        await broker.stop()


async def request(bus: EventBus, subject: str, payload: bytes) -> Reply:
    return Reply.model_validate_json((await bus.nc.request(subject, payload, timeout=2)).data)


async def test_a_leader_only_answer_is_given_during_a_term_and_nobody_answers_between_terms(
        answering: Answering) -> None:
    bus = answering.bus
    with pytest.raises(nats.errors.NoRespondersError):
        await bus.nc.request("tests.ask.alpha", b'{"n": 1}', timeout=2)
    for term, name in enumerate(("first", "second")):
        async with answering.router.leading(answering.broker, Clerk(name)):
            assert await request(bus, "tests.ask.alpha", b'{"n": %d}' % term) == Reply(
                ok=True, text=f"{name} answers alpha: {term + 1}")
        with pytest.raises(nats.errors.NoRespondersError):
            await bus.nc.request("tests.ask.alpha", b'{"n": 1}', timeout=2)


async def test_a_malformed_request_gets_its_answers_refusal(answering: Answering) -> None:
    bus = answering.bus
    async with answering.router.leading(answering.broker, Clerk("leader")):
        assert await request(bus, "tests.ask.bravo", b'{"m": 1}') == Reply(
            ok=False, text="Malformed question: Field required")
        assert (await request(bus, "tests.ask.bravo", b"not json")).ok is False
        assert (await request(bus, "tests.ask.bravo", b'{"n": 2}')).ok  # still answering


async def test_an_answer_not_only_for_leaders_is_given_whenever_the_broker_runs(answering: Answering) -> None:
    bus = answering.bus
    assert await request(bus, "tests.always", b'{"n": 7}') == Reply(ok=True, text="the clerk: 7")
    assert await request(bus, "tests.always", b"[]") == Reply(
        ok=False, text="Malformed question: Input should be an object")


async def test_an_answer_with_a_reply_prefix_answers_the_askers_inbox_alone(answering: Answering,
                                                                              nats_server: RunningNats) -> None:
    """A request may name any reply subject; the answer goes out with the service's rights, so only the asker's own
    inbox is answered (and a request naming another is not even handled)."""
    bus = answering.bus
    asker = await nats.connect(nats_server.url, inbox_prefix="_INBOX_T.alpha")
    stolen: list[str] = []

    async def seen(message: Msg) -> None:
        stolen.append(message.subject)

    watch = await bus.nc.subscribe("elsewhere.>", cb=seen)
    try:
        async with answering.router.leading(answering.broker, Clerk("leader")):
            ANSWERED.clear()
            reply = Reply.model_validate_json((await asker.request("tests.mine.alpha", b'{"n": 1}', timeout=2)).data)
            assert reply == Reply(ok=True, text="to alpha: 1")
            await asker.publish("tests.mine.alpha", b'{"n": 2}', reply="elsewhere.lease")
            await asker.publish("tests.mine.alpha", b'{"n": 3}')  # no reply subject at all
            await asker.publish("tests.mine.bravo", b'{"n": 4}', reply="_INBOX_T.alpha.x")  # another asker's
            with pytest.raises(nats.errors.TimeoutError):
                await asker.request("tests.mine.bravo", b'{"n": 5}', timeout=1)
            await asker.flush()
            await asyncio.sleep(0.5)
            assert stolen == []
            assert ANSWERED == [1]
    finally:
        await watch.unsubscribe()
        await asker.close()
