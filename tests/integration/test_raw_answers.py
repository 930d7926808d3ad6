"""A router's raw answers (requests of no contract, as the auth callout's), on faststream against the real
nats-server: the handler, a method of the service's dependencies, gets the request as nats-py received it and replies
with bytes of its own, or leaves it unanswered (the router sends nothing for it); every process subscribed answers in
one queue group, so each request is answered once."""

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field

import nats.errors
import pytest
from nats.aio.msg import Msg

from services.runtime.nats.bus import EventBus
from services.runtime.nats.delivery import RawAnswer, ServiceRouter
from tests.conftest import RunningNats
from tests.integration.router_support import serving

SEALED = RawAnswer("tests.sealed", "tests-sealers")


@dataclass
class Sealer:
    """Answers a request it trusts with its bytes reversed; a forged one (`forged:`) it leaves unanswered."""

    name: str
    seen: list[bytes] = field(default_factory=list)

    async def on_request(self, message: Msg) -> None:
        self.seen.append(message.data)
        if not message.data.startswith(b"forged:"):
            await message.respond(message.data[::-1] + self.name.encode())


@asynccontextmanager
async def sealer(nats_server: RunningNats, name: str) -> AsyncIterator[tuple[Sealer, EventBus]]:
    router = ServiceRouter("tests", dependencies="sealer")
    router.answers(SEALED, Sealer.on_request, "Seal a request.")
    found = Sealer(name)
    async with serving(nats_server.url, router, found, f"tests-{name}") as bus:
        yield found, bus


async def test_a_raw_answer_replies_with_the_handlers_own_bytes(nats_server: RunningNats) -> None:
    async with sealer(nats_server, "one") as (one, bus):
        reply = await bus.nc.request(SEALED.subject, b"\x00sealed\xff", timeout=5)
    assert reply.data == b"\xffdelaes\x00one" and one.seen == [b"\x00sealed\xff"]


async def test_a_request_the_handler_leaves_unanswered_gets_no_answer_at_all(nats_server: RunningNats) -> None:
    async with sealer(nats_server, "one") as (one, bus):
        with pytest.raises(nats.errors.TimeoutError):
            await bus.nc.request(SEALED.subject, b"forged: let me in", timeout=1.5)
        assert one.seen == [b"forged: let me in"]
        assert (await bus.nc.request(SEALED.subject, b"ok", timeout=5)).data == b"koone", "it answers the next"


async def test_every_process_answers_in_one_queue_group_each_request_once(nats_server: RunningNats) -> None:
    async with AsyncExitStack() as stack:
        one, bus = await stack.enter_async_context(sealer(nats_server, "one"))
        two, _ = await stack.enter_async_context(sealer(nats_server, "two"))
        replies = [(await bus.nc.request(SEALED.subject, f"r{n}".encode(), timeout=5)).data for n in range(40)]
    assert len(one.seen) + len(two.seen) == 40 and one.seen and two.seen
    assert sorted(replies) == sorted(f"r{n}".encode()[::-1] + (b"one" if f"r{n}".encode() in one.seen else b"two")
                                     for n in range(40))
