"""The object-store watch restarts the stack's own SeaweedFS when, after its volume was under its reserve, it goes
on refusing writes once space is back: never a store whose volume never ran short, never one that writes again by
itself, never one that does not answer at all (the supervisor restarts a dead process), and never more often than
its backoff allows."""

import time
from pathlib import Path

import pytest

from infra import object_store_watch, volume_space
from infra.object_store_watch import ObjectStoreWatch, Probe
from tests.unit.infra.fake_server import FakeServer

FULL = (0, 10_000_000)
ROOMY = (50_000_000, 10_000_000)


class Watched:
    """A watch whose volume reads `space` and whose probes are answered `answer`."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.space = FULL
        self.answer: Probe = "refused"
        self.probes = 0
        self.store = FakeServer("s3")
        self.watch = ObjectStoreWatch(tmp_path, client=None, bucket="sheshnag")
        monkeypatch.setattr(object_store_watch, "space_of", lambda *_: self.space)
        monkeypatch.setattr(object_store_watch, "PROBE_EVERY_S", 0.0)

        async def probe() -> Probe:
            self.probes += 1
            return self.answer

        self.watch._probe = probe  # type: ignore[method-assign]

    async def tick(self, space: tuple[int, int], answer: Probe = "refused") -> None:
        self.space, self.answer = space, answer
        await self.watch.check(self.store, lambda: None)


@pytest.fixture
def watched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Watched:
    return Watched(tmp_path, monkeypatch)


async def test_a_store_whose_volume_never_ran_short_is_never_probed(watched: Watched) -> None:
    for _ in range(3):
        await watched.tick(ROOMY, "refused")
    assert watched.probes == 0 and watched.store.stops == 0


async def test_a_store_that_writes_again_once_space_returns_is_left_alone(watched: Watched,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(object_store_watch, "STUCK_AFTER_S", 0.0)
    await watched.tick(FULL)
    assert watched.probes == 0  # nothing to learn while the disk is full

    await watched.tick(ROOMY, "written")
    await watched.tick(ROOMY, "refused")  # a later refusal, with no full disk before it, is not this watch's
    assert watched.probes == 1 and watched.store.stops == 0


async def test_a_store_still_refusing_writes_after_space_returned_is_restarted_once_it_has_had_its_time(
        watched: Watched, monkeypatch: pytest.MonkeyPatch) -> None:
    await watched.tick(FULL)
    await watched.tick(ROOMY)
    assert watched.probes == 1 and watched.store.stops == 0, "restarted before it had its time to recover"

    monkeypatch.setattr(object_store_watch, "STUCK_AFTER_S", 0.0)
    await watched.tick(ROOMY)
    assert watched.store.stops == 1 and watched.store.restarts == 1

    await watched.tick(ROOMY, "written")
    await watched.tick(ROOMY)
    assert watched.store.stops == 1


async def test_a_store_that_does_not_answer_is_left_to_the_supervisor(watched: Watched,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(object_store_watch, "STUCK_AFTER_S", 0.0)
    await watched.tick(FULL)
    for _ in range(3):
        await watched.tick(ROOMY, "unreachable")
    assert watched.probes == 3 and watched.store.stops == 0


async def test_restarts_of_a_store_that_stays_stuck_back_off(watched: Watched,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(object_store_watch, "STUCK_AFTER_S", 0.0)
    await watched.tick(FULL)
    for _ in range(3):
        await watched.tick(ROOMY)
    assert watched.store.stops == 1

    monkeypatch.setattr(volume_space, "RESTART_BACKOFF_S", 0.0)
    await watched.tick(ROOMY)
    assert watched.store.stops == 2



def test_the_backoff_remembers_only_the_restarts_that_still_count() -> None:
    backoff = volume_space.RestartBackoff(restarts=[time.monotonic() - volume_space.BACKOFF_MEMORY_S - 1])
    backoff.note()
    assert len(backoff.restarts) == 1 and backoff.waiting()
