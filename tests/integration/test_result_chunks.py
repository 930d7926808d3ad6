"""The results pages' chunks (services/gateway/adapters/result_chunks.py), on a real S3 server: paging through a chunk
reads it once however many pages ask; a chunk an executor made too large is never read whole nor shown, one that
does not decode is left out, and one removed with its batch shows nothing until it is there again."""

import asyncio
import secrets
from collections.abc import AsyncIterator

import pytest

from contracts.api.output_line import CommittedLine, OutputLine, OutputResponse
from services.gateway.adapters import result_chunks
from services.gateway.adapters.result_chunks import ResultChunks
from services.runtime.storage.objectstore import ObjectStore


def chunk(count: int) -> bytes:
    lines = [CommittedLine(line=n, custom_id=f"c{n}", output=OutputLine(
        id=f"r{n}", custom_id=f"c{n}", response=OutputResponse(status_code=200, request_id=f"q{n}", body={"n": n})))
        for n in range(1, count + 1)]
    return b"".join(line.model_dump_json().encode() + b"\n" for line in lines)


class CountedReads:
    """The store, counting the bytes read of each object."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self.read: dict[str, int] = {}

    async def iter_chunks(self, key: str) -> AsyncIterator[bytes]:
        async for part in self.store.iter_chunks(key):
            self.read[key] = self.read.get(key, 0) + len(part)
            yield part


def key() -> str:
    return f"results/batch_{secrets.token_hex(6)}/attempt-1/chunk-1.jsonl"


async def test_pages_asking_for_one_chunk_at_once_or_in_turn_read_it_once(object_store: ObjectStore) -> None:
    chunks, store, at = ResultChunks(), CountedReads(object_store), key()
    data = chunk(200)
    await object_store.put_bytes(at, data)
    together = await asyncio.gather(*(chunks.lines(store.iter_chunks, at) for _ in range(8)))
    in_turn = [await chunks.lines(store.iter_chunks, at) for _ in range(5)]
    assert all([line.line for line in lines] == list(range(1, 201)) for lines in [*together, *in_turn])
    assert store.read == {at: len(data)}


async def test_a_chunk_over_the_bound_is_left_out_and_not_read_whole(
        object_store: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(result_chunks, "MAX_CHUNK_BYTES", 10_000)
    chunks, store, at = ResultChunks(), CountedReads(object_store), key()
    await object_store.put_bytes(at, chunk(5_000))  # about 1 MB, many of the store's parts
    assert await chunks.lines(store.iter_chunks, at) == []
    assert store.read[at] < 1_000_000


async def test_a_chunk_that_does_not_decode_is_left_out(object_store: ObjectStore) -> None:
    at = key()
    await object_store.put_bytes(at, chunk(2) + b'{"line": "not a number"}\n')
    assert await ResultChunks().lines(object_store.iter_chunks, at) == []


async def test_a_chunk_not_there_shows_nothing_until_it_is(object_store: ObjectStore) -> None:
    chunks, at = ResultChunks(), key()
    assert await chunks.lines(object_store.iter_chunks, at) == []
    await object_store.put_bytes(at, chunk(3))
    assert [line.line for line in await chunks.lines(object_store.iter_chunks, at)] == [1, 2, 3]


async def test_the_chunks_kept_are_bounded_by_their_bytes(
        object_store: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> None:
    data = chunk(50)
    monkeypatch.setattr(result_chunks, "KEPT_BYTES", 3 * len(data))
    chunks, keys = ResultChunks(), [key() for _ in range(6)]
    for at in keys:
        await object_store.put_bytes(at, data)
        await chunks.lines(object_store.iter_chunks, at)
    assert list(chunks.kept) == keys[-3:] and chunks.kept_bytes == 3 * len(data)
