"""A service's router run as a service runs it, on a broker of its own against the real nats-server."""

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress

import nats.errors
from nats.aio.msg import Msg
from pydantic import BaseModel

from services.runtime.nats.answers import Answer, Refused, Request
from services.runtime.nats.bus import EventBus
from services.runtime.nats.delivery import ServiceRouter
from services.runtime.process.telemetry import attached, extract_context
from tests.request_subjects import requester_of


@asynccontextmanager
async def serving(url: str, router: ServiceRouter, dependencies: object, name: str) -> AsyncIterator[EventBus]:
    """`router` on a started broker named `name`, with `dependencies` under the router's name for them, until the
    block ends; the bus over the broker's connection."""
    bus = await EventBus.connect(url, name)
    broker = bus.broker
    broker.include_router(router)
    broker.context.set_global(router.dependencies, dependencies)
    await broker.start()
    try:
        yield bus
    finally:
        await broker.stop()


def bare(answer: Answer[Request],
         judge: Callable[[str, Request], Awaitable[BaseModel]]) -> Callable[[Msg], Awaitable[None]]:
    """A bare nats-py subscription's callback (one answerer, no broker): each request judged as asked by the
    executor its subject names, as the scheduler's router would."""
    async def respond(message: Msg) -> None:
        requester = requester_of(answer, message.subject)
        try:
            with attached(extract_context(message.headers)):
                reply = await judge(requester, answer.decode(message.data))
        except Refused as refused:
            reply = refused.reply
        with suppress(nats.errors.Error):  # the asker is gone, or the connection is reconnecting: it asks again
            await message.respond(reply.model_dump_json().encode())
    return respond
