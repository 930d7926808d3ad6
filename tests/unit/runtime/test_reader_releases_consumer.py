"""The ordered reader's consumer goes with it on every path: also when its inbox cannot be subscribed after the
consumer was made, and when the unsubscribe of a closing reader fails (the connection draining at a stop). Before,
both left the consumer on the broker until its inactivity threshold (60 s), one per stream, fold or restart."""

import asyncio
from types import SimpleNamespace

import nats.errors
import pytest

from services.runtime.nats.follower import OrderedReader


class FakeSubscription:
    def __init__(self, bus: "FakeBus") -> None:
        self.bus = bus

    async def unsubscribe(self) -> None:
        if self.bus.unsubscribe_fails:
            raise nats.errors.ConnectionDrainingError
        self.bus.subscribed -= 1


class FakeBus:
    def __init__(self, subscribe_fails: bool = False, unsubscribe_fails: bool = False) -> None:
        self.consumers: set[str] = set()
        self.subscribed = 0
        self.subscribe_fails = subscribe_fails
        self.unsubscribe_fails = unsubscribe_fails
        self.js = SimpleNamespace(add_consumer=self.add_consumer, delete_consumer=self.delete_consumer)
        self.nc = SimpleNamespace(new_inbox=lambda: "_INBOX.x", subscribe=self.subscribe, publish=self.publish)

    async def add_consumer(self, stream: str, config: object) -> SimpleNamespace:
        name = f"c{len(self.consumers)}"
        self.consumers.add(name)
        return SimpleNamespace(name=name)

    async def delete_consumer(self, stream: str, name: str) -> bool:
        self.consumers.discard(name)
        return True

    async def subscribe(self, subject: str, cb: object) -> FakeSubscription:
        if self.subscribe_fails:
            raise nats.errors.ConnectionDrainingError
        self.subscribed += 1
        return FakeSubscription(self)

    async def publish(self, *args: object, **kwargs: object) -> None:
        pass


def test_a_consumer_whose_inbox_could_not_be_subscribed_is_deleted() -> None:
    bus = FakeBus(subscribe_fails=True)

    async def read() -> None:
        async with OrderedReader(bus, 0, 10, "evt.batch.b.>").reading(consumer_first=True):  # type: ignore[arg-type]
            pass

    with pytest.raises(nats.errors.ConnectionDrainingError):
        asyncio.run(read())
    assert bus.consumers == set()


def test_a_closing_reader_deletes_its_consumer_even_when_the_unsubscribe_fails() -> None:
    bus = FakeBus(unsubscribe_fails=True)

    async def read() -> None:
        async with OrderedReader(bus, 0, 10, "evt.batch.b.>").reading(consumer_first=True):  # type: ignore[arg-type]
            assert len(bus.consumers) == 1

    asyncio.run(read())
    assert bus.consumers == set()
