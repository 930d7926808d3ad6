"""An object's lines, however its chunks fall: split at `\\n`, a trailing `\\r` dropped, an unended last line kept,
and a line spanning many chunks gathered whole (each piece copied once, into the line)."""

from collections.abc import AsyncIterator, Sequence

import pytest

from services.runtime.storage.lines import LineSplitter
from services.runtime.storage.objectstore import split_lines

TEXT = b'{"a": 1}\r\n\n{"b": 2}\n' + b"x" * 1000 + b"\r\n\r\n" + b'{"last": true}'
EXPECTED = [b'{"a": 1}', b"", b'{"b": 2}', b"x" * 1000, b"", b'{"last": true}']


async def chunked(data: bytes, sizes: Sequence[int]) -> AsyncIterator[bytes]:
    at, turn = 0, 0
    while at < len(data):
        size = sizes[turn % len(sizes)]
        yield data[at:at + size]
        at, turn = at + size, turn + 1


@pytest.mark.parametrize("sizes", [[len(TEXT)], [1], [2, 3], [7], [64], [999, 1], [1, 1000, 5]])
async def test_any_chunking_gives_the_same_lines(sizes: list[int]) -> None:
    assert [line async for line in split_lines(chunked(TEXT, sizes))] == EXPECTED


async def test_a_last_line_with_its_ending_leaves_no_empty_line_after_it() -> None:
    assert [line async for line in split_lines(chunked(b"a\nb\r\n", [1]))] == [b"a", b"b"]


async def test_a_line_of_many_chunks_comes_whole() -> None:
    long_line = b"y" * (1 << 20)
    assert [len(line) async for line in split_lines(chunked(long_line + b"\nz", [4096]))] == [1 << 20, 1]


@pytest.mark.parametrize("sizes", [[1], [2], [4], [len(TEXT) + 3]])
async def test_a_byte_order_mark_before_the_first_line_is_dropped_and_one_later_is_kept(sizes: list[int]) -> None:
    marked = b"\xef\xbb\xbf" + TEXT + b"\n\xef\xbb\xbf{}"
    assert [line async for line in split_lines(chunked(marked, sizes))] == [*EXPECTED, b"\xef\xbb\xbf{}"]
    assert [line async for line in split_lines(chunked(b"\xef\xbb\xbf{}", sizes))] == [b"{}"], "an unended only line"


def test_a_byte_order_mark_does_not_count_towards_the_first_lines_length_cap() -> None:
    cap = 100
    over = b'{"custom_id": "x", "body": {}}' + b" " * (3 * cap) + b"\n"
    for data in (over, b"\xef\xbb\xbf" + over):
        splitter = LineSplitter(cap)
        lines = [line for at in range(0, len(data), 7) for line in splitter.feed(data[at:at + 7])] + splitter.finish()
        assert len(lines[0]) > cap, "a line past the cap is still past it, with a mark or without"
