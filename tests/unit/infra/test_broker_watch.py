"""The broker watch restarts the stack's own nats-server once space returns after a full disk, once per fault:
never for a broker that stopped writing for another reason, never again while a restarted one is slow to come
back, and never more often than its backoff allows."""

from pathlib import Path

import pytest

from infra import volume_space
from infra.broker_watch import BrokerWatch
from tests.unit.infra.fake_server import FakeServer


def watch(tmp_path: Path, space: list[tuple[int, int]]) -> BrokerWatch:
    log_file = tmp_path / "nats.log"
    log_file.write_bytes(b"")
    made = BrokerWatch(tmp_path, log_file, url=None)
    made._space = lambda: space[0]  # type: ignore[method-assign]
    return made


async def test_a_full_disk_is_noted_and_the_broker_restarted_once_space_returns(tmp_path: Path) -> None:
    space = [(0, 10_000_000)]
    made, broker = watch(tmp_path, space), FakeServer("nats-server")
    await made.check(broker, lambda: None)
    assert made.fault is not None and broker.stops == 0

    space[0] = (50_000_000, 10_000_000)
    await made.check(broker, lambda: None)
    await made.check(broker, lambda: None)

    assert broker.stops == 1 and broker.restarts == 1 and made.fault is None


async def test_a_broker_slow_to_come_back_is_not_restarted_again(tmp_path: Path) -> None:
    space = [(0, 10_000_000)]
    made, broker = watch(tmp_path, space), FakeServer("nats-server")
    await made.check(broker, lambda: None)
    space[0] = (50_000_000, 10_000_000)

    def not_ready() -> None:
        raise TimeoutError("nats-server did not listen within 15s")

    with pytest.raises(TimeoutError):
        await made.check(broker, not_ready)
    for _ in range(5):
        await made.check(broker, not_ready)

    assert broker.stops == 1


async def test_a_write_fault_without_a_full_disk_is_left_to_the_operator(tmp_path: Path) -> None:
    space = [(50_000_000, 10_000_000)]
    made, broker = watch(tmp_path, space), FakeServer("nats-server")
    await made.check(broker, lambda: None)  # the first look starts at the log's end
    made.log_file.write_bytes(b"[ERR] JetStream critical write error: input/output error\n")

    for _ in range(3):
        await made.check(broker, lambda: None)

    assert made.fault is not None and broker.stops == 0


async def test_restarts_for_faults_in_quick_succession_back_off(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    space = [(0, 10_000_000)]
    made, broker = watch(tmp_path, space), FakeServer("nats-server")
    for _ in range(3):
        space[0] = (0, 10_000_000)
        await made.check(broker, lambda: None)
        space[0] = (50_000_000, 10_000_000)
        await made.check(broker, lambda: None)

    assert broker.stops == 1  # the second fault waits out the backoff
    monkeypatch.setattr(volume_space, "RESTART_BACKOFF_S", 0.0)
    await made.check(broker, lambda: None)
    assert broker.stops == 2
