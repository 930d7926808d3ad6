"""A keeper of a bucket's keys, against a real broker: it is shown every current value, told when it has been,
then each change; and the watch's consumer is one the broker drops within a minute once nobody listens (a process
killed leaves it behind)."""

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from services.runtime.nats.bus import EventBus
from services.runtime.nats.kv import open_bucket
from services.runtime.nats.kv_watch import WATCH_INACTIVE_S, keep
from tests.conftest import RunningNats


@dataclass
class Kept:
    values: dict[str, bytes | None] = field(default_factory=dict)
    said: list[str] = field(default_factory=list)

    def restart(self) -> None:
        self.said.append("restart")
        self.values = {}

    def put(self, key: str, value: bytes | None, revision: int) -> None:
        self.values[key] = value or None

    def current(self) -> None:
        self.said.append("current")

    def lost(self) -> None:
        self.said.append("lost")


async def until(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_a_keeper_is_shown_the_current_values_then_each_change_by_a_watch_the_broker_drops_when_idle(
        fresh_nats: RunningNats) -> None:
    bus = await EventBus.connect(fresh_nats.url, "tests")
    try:
        kv = await open_bucket(bus, "kept")
        await kv.put("thing.a", b"1")
        kept = Kept()
        keeping = asyncio.create_task(keep(kv, "thing.*", kept, "things"))
        await until(lambda: "current" in kept.said)
        assert kept.values == {"thing.a": b"1"} and kept.said == ["restart", "current"]

        await kv.put("thing.b", b"2")
        await kv.delete("thing.a")
        await until(lambda: kept.values == {"thing.a": None, "thing.b": b"2"})

        [watch] = await bus.js.consumers_info(kv.stream)
        assert watch.config.inactive_threshold == WATCH_INACTIVE_S
        keeping.cancel()
        await asyncio.gather(keeping, return_exceptions=True)
        assert kept.said[-1] == "lost"
    finally:
        await bus.close()
