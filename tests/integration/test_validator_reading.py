"""The validator reads an input file in its checking thread, a chunk at a time, and writes a failed batch's error
file from what validation recorded: against the real S3 server, the lines are the store's own, in order, and the
error file holds, byte for byte, the lines built one by one from each input line."""

import asyncio

import orjson
import pytest

from contracts.api.request_line import MAX_LINE_BYTES
from contracts.ids import new_batch_id, new_file_id
from contracts.subjects import input_object_key
from services.runtime.storage.catalogue import load_catalogue
from services.runtime.storage.objectstore import ObjectStore
from services.validator.adapters.error_file import write_error_file
from services.validator.adapters.input_lines import lines_by_chunk
from services.validator.domain import FileValidation, Limits
from services.validator.refusals import not_run_message, not_run_output, rejected_line
from tests.factories import batch_created

CHAT = "/v1/chat/completions"


def request(custom_id: object, **body: object) -> bytes:
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": CHAT,
                         "body": {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], **body}})


async def read_in_a_thread(store: ObjectStore, key: str, chunk_bytes: int) -> list[bytes]:
    return await asyncio.to_thread(lambda: [line for lines in lines_by_chunk(store, key, MAX_LINE_BYTES, chunk_bytes)
                                            for line in lines])


async def test_lines_read_a_chunk_at_a_time_are_the_stores_lines(object_store: ObjectStore) -> None:
    content = b"\r\n".join([request("a"), b"", request("b" * 300)]) + b"\n\n" + request("c") + b"\r\n" + b"last"
    key = input_object_key(new_file_id())
    await object_store.put_bytes(key, content)
    expected = [line async for line in object_store.iter_lines(key)]
    assert expected[-1] == b"last" and b"" in expected
    for chunk_bytes in (1, 7, 64, 1 << 20):
        assert await read_in_a_thread(object_store, key, chunk_bytes) == expected
    await object_store.put_bytes(key, content + b"\n")
    assert await read_in_a_thread(object_store, key, 5) == expected, "a final line ending ends the last line"


async def test_a_line_past_the_limit_is_read_as_a_stand_in_of_its_first_bytes(object_store: ObjectStore) -> None:
    key = input_object_key(new_file_id())
    await object_store.put_bytes(key, request("a") + b"\n" + b"{" * 5000 + b"\n" + request("b"))
    lines = await asyncio.to_thread(lambda: [line for lines in lines_by_chunk(object_store, key, 200, 64)
                                             for line in lines])
    assert lines == [request("a"), b"{" * 202, request("b")]


@pytest.mark.parametrize("max_lines", [8, 50_000], ids=["lines-past-the-limit-read-again", "written-from-memory"])
async def test_the_error_file_holds_the_lines_built_one_by_one_from_the_input(object_store: ObjectStore,
                                                                             max_lines: int) -> None:
    lines = [request("good-1"), b"{oops", b"", request("good-1"), request('q"u\\o\u00e9te\u2028'),
             request(None), request("x" * 600), request("good-2", temperature=9), request("past-1"),
             request("past-2"), b'{"custom_id": 5}']
    file_id, batch_id = new_file_id(), new_batch_id()
    created = batch_created(batch_id, "key_test", input_object_key(file_id), created_at=0, expires_at=86400)
    await object_store.put_bytes(created.terms.input_object_key, b"\n".join(lines))
    validation = FileValidation(CHAT, load_catalogue(None), Limits(max_lines=max_lines))
    refused = {}
    for number, raw in enumerate(lines, start=1):
        result = validation.check(number, raw)
        if result.issues:
            refused[number] = rejected_line(result)
    assert validation.limit_line == (10 if max_lines == 8 else None), "two past the limit, the first refused for it"

    stored = await write_error_file(object_store, created, validation, refused)
    assert stored is not None
    written = await object_store.get_bytes(stored.object_key)
    message = not_run_message(validation)
    expected = [refused[n].error_line(batch_id) if n in refused else
                not_run_output(batch_id, n, raw, message, checked=not validation.unchecked(n))
                for n, raw in enumerate(lines, start=1) if raw.strip()]
    assert written == b"".join(line.model_dump_json().encode() + b"\n" for line in expected)
    assert stored.line_count == len(expected) == len(lines) - 1
