"""Core request/reply answers declared on a ServiceRouter, against the real broker: a leader-only answer is
subscribed for a term at a time (no responders between terms), a malformed request gets its answer's refusal."""

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated

import nats.errors
import pytest
from faststream import Context, Path
from faststream.nats import NatsBroker
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


async def ask(question: Question, who: Annotated[str, Path()], term: Annotated[Clerk, Context()]) -> Reply:
    return Reply(ok=True, text=f"{term.name} answers {who}: {question.n + 1}")


async def always(question: Question, clerk: Annotated[Clerk, Context()]) -> Reply:
    return Reply(ok=True, text=f"{clerk.name}: {question.n}")


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
