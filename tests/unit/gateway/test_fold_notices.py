"""A read-back of the gateway's own write waits for the ledger's notice that the write is folded, then reads once;
without notices (lost, or a ledger that sends none) it still reads, every NOTICE_WAIT_S; a notice is only a hint."""

import asyncio
import time

import pytest

from services.gateway.adapters import fold_notices
from services.gateway.adapters.fold_notices import FoldNotices


class Reads:
    """A read model that shows the record from the `shown_from`-th read on (0: never)."""

    def __init__(self, shown_from: int = 1) -> None:
        self.count = 0
        self.shown_from = shown_from

    async def __call__(self) -> str | None:
        self.count += 1
        return "record" if self.shown_from and self.count >= self.shown_from else None


def test_only_a_higher_sequence_in_ascii_digits_moves_the_notices_on() -> None:
    notices = FoldNotices()
    for data in (b"12", b"7", b"", b"x9", b"\xd9\xa3", b"1" * 21, b"-5", "²".encode()):
        notices.take(data)
    assert notices.through == 12


async def test_a_read_back_reads_once_when_the_notice_says_its_write_is_folded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fold_notices, "NOTICE_WAIT_S", 30.0)
    notices, reads = FoldNotices(), Reads()
    reading = asyncio.create_task(notices.read_back(reads, 40, within_s=30))
    await asyncio.sleep(0.05)
    assert reads.count == 0  # nothing read before the ledger says so
    notices.take(b"39")
    await asyncio.sleep(0)
    assert not reading.done()
    notices.take(b"41")
    assert await reading == "record" and reads.count == 1


async def test_a_write_already_folded_is_read_at_once() -> None:
    notices, reads = FoldNotices(through=100), Reads()
    assert await notices.read_back(reads, 100, within_s=30) == "record" and reads.count == 1


async def test_without_notices_a_read_back_still_reads_every_notice_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fold_notices, "NOTICE_WAIT_S", 0.01)
    reads = Reads(shown_from=3)
    assert await FoldNotices().read_back(reads, 5, within_s=30) == "record" and reads.count == 3


async def test_a_notice_ahead_of_the_read_model_falls_back_to_reading_again_until_the_deadline(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fold_notices, "TOLD_POLL_S", 0.01)
    notices, reads = FoldNotices(through=10), Reads(shown_from=0)  # told, yet never shown (a forged notice)
    started = time.monotonic()
    assert await notices.read_back(reads, 5, within_s=0.2) is None
    assert 2 <= reads.count <= 0.2 / 0.01 + 1  # paced, not a busy loop
    assert time.monotonic() - started >= 0.2
