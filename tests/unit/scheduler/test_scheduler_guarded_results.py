"""The closer reads result chunks within a bound: a chunk over it is left out (its lines count as never run) and its
body released at once; an undecodable chunk is left out; the others are read."""

from collections.abc import AsyncIterator
from typing import cast

import pytest

from services.executor.adapters.objects import ObjectAccess
from services.scheduler import closer
from services.scheduler.closer import GuardedResults


class Chunks:
    """An object store whose objects arrive in parts, noting which reads ended released."""

    def __init__(self, objects: dict[str, list[bytes]]) -> None:
        self.objects = objects
        self.released: list[str] = []

    async def iter_chunks(self, key: str) -> AsyncIterator[bytes]:
        try:
            for part in self.objects[key]:
                yield part
        finally:
            self.released.append(key)


async def test_a_chunk_over_the_bound_is_left_out_and_released_and_the_others_are_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(closer, "MAX_CHUNK_BYTES", 16)
    store = Chunks({"bad": [b"not a line\n"], "good": [b"\n"], "over": [b"x" * 10, b"x" * 10, b"x" * 10]})
    read = await GuardedResults(cast(ObjectAccess, store)).chunks(["over", "good", "bad"])
    assert read == [("good", [])]
    assert store.released == ["bad", "good", "over"]  # "over", read last, released before the read returned
