"""A batch's input is downloaded once per executor and read by each unit at its own lines: numbered as the store's
line split numbers them, as they arrive, shared by concurrent first units, given up promptly on a stop, downloaded
again after a failure or once idle, and streamed from the store past the disk budget."""

import asyncio
from collections.abc import AsyncIterator

import pytest

from services.executor.adapters.input_cache import InputCache, InputCopy
from services.runtime.storage.objectstore import ObjectNotFound, split_lines

KEY = "files/file-in/content"


class SlowStore:
    """An object store holding one object, sent in small chunks; `gate` holds the chunks after the first `open`
    ones until set. Counts what is read."""

    def __init__(self, data: bytes, chunk: int = 7, open_chunks: int = 10**9) -> None:
        self.data = data
        self.chunk = chunk
        self.open_chunks = open_chunks
        self.gate = asyncio.Event()
        self.downloads = 0
        self.streamed = 0
        self.fail_after: int | None = None

    async def iter_chunks(self, key: str) -> AsyncIterator[bytes]:
        if key != KEY:
            raise ObjectNotFound(key)
        self.downloads += 1
        for number, at in enumerate(range(0, len(self.data), self.chunk)):
            if number >= self.open_chunks:
                await self.gate.wait()
            if self.fail_after is not None and number >= self.fail_after:
                raise ConnectionResetError("the store went away")
            await asyncio.sleep(0)
            yield self.data[at:at + self.chunk]

    def iter_lines(self, key: str) -> AsyncIterator[bytes]:
        self.streamed += 1
        return split_lines(self.iter_chunks(key))

    async def get_bytes(self, key: str) -> bytes:
        raise AssertionError("the cache streams")

    async def put_bytes(self, key: str, data: bytes, content_type: str = "application/jsonl") -> None:
        raise AssertionError("the cache only reads")

    async def list_keys(self, prefix: str) -> list[str]:
        return []


def numbered(count: int) -> bytes:
    return b"".join(b'{"n": %d}\n' % n for n in range(1, count + 1))


async def read(copy: InputCopy, first: int, last: int | None, stop: asyncio.Event | None = None) -> list[
        tuple[int, bytes]]:
    return [line async for line in copy.lines(first, last, stop or asyncio.Event())]


async def test_a_unit_reads_only_its_own_lines_numbered_as_the_store_splits_the_object() -> None:
    data = b'{"a": 1}\r\n\n{"b": 2}\n' + numbered(100) + b'{"last": true}'
    store = SlowStore(data)
    cache = InputCache(store)
    async with cache.hold("batch_a", KEY) as copy:
        everything = await read(copy, 1, None)
        assert everything == list(enumerate([line async for line in split_lines(store.iter_chunks(KEY))], 1))
        assert await read(copy, 40, 43) == everything[39:43]
        assert await read(copy, 100, None) == everything[99:]
        assert await read(copy, 1, 2) == [(1, b'{"a": 1}'), (2, b"")]
        assert await read(copy, 200, 300) == [], "past the object's end there is nothing"
    assert cache.downloads == 1


async def test_two_units_of_one_batch_starting_together_download_its_input_once() -> None:
    store = SlowStore(numbered(128), chunk=64)
    cache = InputCache(store)

    async def unit(first: int, last: int) -> list[tuple[int, bytes]]:
        async with cache.hold("batch_a", KEY) as copy:
            return await read(copy, first, last)

    first, second = await asyncio.gather(unit(1, 64), unit(65, 128))
    assert [n for n, _ in first] == list(range(1, 65)) and [n for n, _ in second] == list(range(65, 129))
    assert store.downloads == 1 and cache.downloads == 1
    async with cache.hold("batch_b", KEY) as copy:  # another batch has a copy of its own
        assert len(await read(copy, 1, 3)) == 3
    assert store.downloads == 2


async def test_a_unit_of_the_first_lines_starts_before_the_download_ends() -> None:
    store = SlowStore(numbered(1000), chunk=100, open_chunks=3)
    cache = InputCache(store)
    async with cache.hold("batch_a", KEY) as copy:
        early = await asyncio.wait_for(read(copy, 1, 5), 1.0)
        assert [n for n, _ in early] == [1, 2, 3, 4, 5]
        later = asyncio.create_task(read(copy, 990, 995))
        await asyncio.sleep(0.05)
        assert not later.done(), "its lines have not arrived"
        store.gate.set()
        assert [n for n, _ in await asyncio.wait_for(later, 1.0)] == list(range(990, 996))


async def test_a_unit_waiting_for_its_lines_gives_up_at_once_when_told_to_stop() -> None:
    store = SlowStore(numbered(1000), chunk=100, open_chunks=1)
    cache = InputCache(store)
    stop = asyncio.Event()
    async with cache.hold("batch_a", KEY) as copy:
        waiting = asyncio.create_task(read(copy, 900, 910, stop))
        await asyncio.sleep(0.05)
        stop.set()
        assert await asyncio.wait_for(waiting, 1.0) == []
        store.gate.set()


async def test_a_failed_download_fails_the_units_that_need_lines_past_it_and_the_next_unit_downloads_again() -> None:
    store = SlowStore(numbered(100), chunk=50)
    store.fail_after = 2
    cache = InputCache(store)
    async with cache.hold("batch_a", KEY) as copy:
        assert len(await read(copy, 1, 3)) == 3, "the lines that arrived are served"
        with pytest.raises(ConnectionResetError):
            await read(copy, 90, 100)
    store.fail_after = None
    async with cache.hold("batch_a", KEY) as copy:
        assert [n for n, _ in await read(copy, 90, 100)] == list(range(90, 101))
    assert store.downloads == 2


async def test_a_missing_input_raises_object_not_found_to_the_unit() -> None:
    cache = InputCache(SlowStore(b""))
    async with cache.hold("batch_a", "files/gone/content") as copy:
        with pytest.raises(ObjectNotFound):
            await read(copy, 1, 10)


async def test_a_copy_no_unit_held_for_its_idle_time_is_dropped_and_a_later_unit_downloads_again() -> None:
    store = SlowStore(numbered(10))
    cache = InputCache(store, idle_s=0.05)
    async with cache.hold("batch_a", KEY) as copy:
        await read(copy, 1, None)
    async with cache.hold("batch_a", KEY) as copy:  # within its idle time: the same copy
        await read(copy, 1, 2)
    assert store.downloads == 1
    await asyncio.sleep(0.1)
    assert "batch_a" not in cache.copies and cache.used_bytes == 0
    async with cache.hold("batch_a", KEY) as copy:
        await read(copy, 1, None)
    assert store.downloads == 2
    cache.forget("batch_a")
    assert "batch_a" not in cache.copies and copy.file.closed


async def test_an_input_larger_than_the_disk_budget_streams_its_remaining_lines_from_the_store() -> None:
    data = numbered(500)
    store = SlowStore(data, chunk=256)
    cache = InputCache(store, budget_bytes=1024)
    async with cache.hold("batch_a", KEY) as copy:
        lines = await read(copy, 1, None)
        assert [n for n, _ in lines] == list(range(1, 501)) and lines[-1][1] == b'{"n": 500}'
        assert [n for n, _ in await read(copy, 3, 4)] == [3, 4], "the lines in the copy come from it"
        assert store.streamed == 1
    assert cache.used_bytes <= 1024


async def test_an_idle_copy_makes_room_under_the_budget_for_a_batch_being_run() -> None:
    store = SlowStore(numbered(50), chunk=64)
    cache = InputCache(store, budget_bytes=len(numbered(50)) + 10)
    async with cache.hold("batch_a", KEY) as copy:
        await read(copy, 1, None)
    async with cache.hold("batch_b", KEY) as copy:
        assert len(await read(copy, 1, None)) == 50
        assert store.streamed == 0 and "batch_a" not in cache.copies


async def test_a_copy_forgotten_mid_download_stops_downloading_and_frees_its_disk_once_no_thread_uses_it() -> None:
    store = SlowStore(numbered(1000), chunk=100, open_chunks=2)
    cache = InputCache(store)
    async with cache.hold("batch_a", KEY) as copy:
        assert len(await read(copy, 1, 2)) == 2
        cache.forget("batch_a")
        assert not copy.file.closed, "a unit still holds it"
    assert copy.download is not None
    await asyncio.wait({copy.download}, timeout=1.0)
    for _ in range(100):
        if copy.file.closed:
            break
        await asyncio.sleep(0.01)
    assert copy.download.cancelled() and copy.file.closed and cache.used_bytes == 0


async def test_a_byte_order_mark_before_line_one_is_read_as_the_validator_reads_it() -> None:
    line = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}'
    data = b"\xef\xbb\xbf" + line + b"\n" + line.replace(b'"a"', b'"b"') + b"\n"
    async with InputCache(SlowStore(data, chunk=64)).hold("batch_a", KEY) as copy:
        read = [raw async for _, raw in copy.lines(1, None, asyncio.Event())]
    assert read == [line, line.replace(b'"a"', b'"b"')]
    assert read == [raw async for raw in split_lines(one_chunk(data))]


async def one_chunk(data: bytes) -> AsyncIterator[bytes]:
    yield data
