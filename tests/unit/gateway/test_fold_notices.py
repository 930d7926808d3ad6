"""A read-back of the gateway's own write waits for the ledger's notice that the write is folded, then reads once;
a notice is only a hint: without notices a read-back still reads, and a notice the read model does not bear out
(forged, or a stream made anew) costs reads backing off, never a wrong answer."""

import asyncio

import pytest

from services.gateway.adapters import fold_notices
from services.gateway.adapters.fold_notices import PRUNE_AT, FoldNotices


class Reads:
    """A read model that shows the record from the `shown_from`-th read on (0: never)."""

    def __init__(self, shown_from: int = 1) -> None:
        self.count = 0
        self.shown_from = shown_from

    async def __call__(self) -> str | None:
        self.count += 1
        return "record" if self.shown_from and self.count >= self.shown_from else None


def test_a_notice_is_a_sequence_in_at_most_20_ascii_digits_and_the_latest_wins() -> None:
    notices = FoldNotices()
    for data in (b"", b"x9", b"\xd9\xa3", b"1" * 21, b"-5", "²".encode()):
        notices.take(data)
    assert (notices.through, notices.heard) == (0, False)
    notices.take(b"12")
    notices.take(b"7")  # a stream made anew counts from 1 again: believed, it costs only a read
    assert (notices.through, notices.heard) == (7, True)


async def test_a_read_back_reads_once_when_the_notice_says_its_write_is_folded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fold_notices, "NOTICE_WAIT_S", 30.0)
    notices, reads = FoldNotices(heard=True), Reads()
    reading = asyncio.create_task(notices.read_back(reads, 40, within_s=60))
    await asyncio.sleep(0.05)
    notices.take(b"39")
    await asyncio.sleep(0.05)
    assert reads.count == 0 and not reading.done()  # nothing read before the ledger says so
    notices.take(b"41")
    assert await reading == "record" and reads.count == 1


async def test_a_write_already_folded_is_read_at_once() -> None:
    notices, reads = FoldNotices(through=100, heard=True), Reads()
    assert await notices.read_back(reads, 100, within_s=30) == "record" and reads.count == 1


async def test_before_any_notice_is_heard_a_read_back_polls_as_without_notices() -> None:
    reads = Reads(shown_from=3)
    assert await FoldNotices().read_back(reads, 5, within_s=30) == "record" and reads.count == 3


async def test_once_notices_were_heard_a_read_back_still_reads_every_notice_wait_without_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fold_notices, "NOTICE_WAIT_S", 0.01)
    reads = Reads(shown_from=3)
    assert await FoldNotices(heard=True).read_back(reads, 5, within_s=30) == "record" and reads.count == 3


async def test_a_notice_the_read_model_does_not_bear_out_costs_reads_backing_off_until_the_deadline() -> None:
    notices, reads = FoldNotices(through=10**12, heard=True), Reads(shown_from=0)  # told, never shown (forged)
    assert await notices.read_back(reads, 5, within_s=0.5) is None
    assert 2 <= reads.count <= 8  # 10, 20, 40, 80, 160 ms apart: not a read every few milliseconds


async def test_a_notice_wakes_only_the_read_backs_it_answers_and_finished_waits_are_dropped() -> None:
    notices = FoldNotices(heard=True)
    early, late = (asyncio.create_task(notices.folded(sequence, 30)) for sequence in (10, 50))
    await asyncio.sleep(0.01)
    notices.take(b"20")
    assert await early is True
    await asyncio.sleep(0.01)
    assert not late.done()
    for _ in range(3 * PRUNE_AT):
        assert await notices.folded(99, 0) is False
    assert len(notices._waiting) <= PRUNE_AT + 1
    notices.take(b"60")
    assert await late is True


async def test_a_read_back_of_a_change_to_an_existing_record_waits_until_the_record_shows_it() -> None:
    shown = iter(["held", "held", "released"])

    async def record() -> str:
        return next(shown)

    notices = FoldNotices(through=10**6, heard=True)  # told at once: the reads pace themselves
    assert await notices.read_back(record, 5, within_s=30, ready=lambda r: r == "released") == "released"
    late = FoldNotices(heard=True)
    assert await late.read_back(lambda: asyncio.sleep(0, "held"), 5, within_s=0.05,
                                ready=lambda r: r == "released") == "held"  # the last shown, at the deadline
