"""A service's router run as a service runs it, on a broker of its own against the real nats-server."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from services.runtime.nats.bus import EventBus
from services.runtime.nats.delivery import ServiceRouter


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
