"""An input file's lines as the validator reads them, a chunk at a time: however the chunks are cut, the same lines;
a line past the limit is refused for its length as before, but read at the cost of its first bytes only."""

import random
import tracemalloc
from collections.abc import Iterable

import orjson

from contracts.api.request_line import MAX_LINE_BYTES
from contracts.catalogue import Catalogue
from services.runtime.storage.objectstore import READ_CHUNK
from services.validator.adapters.input_lines import chunk_lines
from services.validator.domain import FileValidation, Limits

LIMIT = 1000


def lines_of(chunks: Iterable[bytes], max_line_bytes: int = LIMIT) -> list[bytes]:
    return [line for lines in chunk_lines(chunks, max_line_bytes) for line in lines]


def cut(data: bytes, rng: random.Random, pieces: int) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, len(data)), pieces))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


def request(custom_id: str, content: str = "hi") -> bytes:
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                         "body": {"model": "smollm2", "messages": [{"role": "user", "content": content}]}})


def test_any_cut_of_the_stream_gives_its_lines_without_line_endings() -> None:
    data = b"\r\n".join([request("a"), b"", request("b", "b" * 300)]) + b"\n\n" + request("c") + b"\r\n" + b"last"
    expected = [line.removesuffix(b"\r") for line in data.split(b"\n")]
    rng = random.Random(3)
    for pieces in (1, 5, 40, len(data) - 1):
        assert lines_of(cut(data, rng, pieces)) == expected
    assert lines_of([data + b"\n"]) == expected, "a final line ending ends the last line"


def test_a_line_past_the_limit_is_refused_for_its_length_however_it_is_cut(catalogue: Catalogue) -> None:
    long = request("long", "x" * 3 * LIMIT)
    at_the_limit = request("limit", "y" * (LIMIT - len(request("limit", ""))))
    data = b"\n".join([request("before"), long, at_the_limit + b"\r", request("after"), long])
    rng = random.Random(5)
    for chunks in ([data], cut(data, rng, 30), cut(data, rng, 300)):
        lines = lines_of(chunks)
        assert [lines[0], *lines[2:4]] == [request("before"), at_the_limit, request("after")]
        validation = FileValidation("/v1/chat/completions", catalogue, Limits(max_line_bytes=LIMIT))
        codes = [[issue.code for issue in validation.feed(n, raw)] for n, raw in enumerate(lines, start=1)]
        assert codes == [[], ["invalid_json_line"], [], [], ["invalid_json_line"]]


def test_a_long_line_is_blank_only_if_all_of_it_is() -> None:
    spaces = b" " * (3 * LIMIT)
    blank, after = lines_of([spaces[:LIMIT], spaces[LIMIT:], b"\n", b"{}"])
    assert blank.isspace() and after == b"{}"
    hidden = lines_of([spaces[:LIMIT], spaces[LIMIT:], b"{}\n"])[0]
    assert len(hidden) > LIMIT and hidden.strip(), "content after a long run of spaces is still a line"


def test_reading_one_unended_line_of_many_megabytes_holds_only_its_first_bytes() -> None:
    chunk = b"x" * READ_CHUNK  # one object, handed out again and again: only the reader's own copies are counted
    tracemalloc.start()
    try:
        lines = lines_of((chunk for _ in range(64)), MAX_LINE_BYTES)  # 16 MiB, no newline
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * MAX_LINE_BYTES + READ_CHUNK
    assert len(lines) == 1 and MAX_LINE_BYTES < len(lines[0]) <= MAX_LINE_BYTES + 2, "a stand-in, over the limit"
