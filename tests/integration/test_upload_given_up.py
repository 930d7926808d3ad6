"""An upload or a read its caller stops waiting for part way (a timeout, a client gone) leaves nothing behind on a real
S3 server: a multipart upload being created is aborted once it exists, an object whose last call was under way when
the caller gave up is removed once that call ends (services/runtime/storage/objectstore.py, StreamingUpload), and a
read given up while its response opens releases that response once it is open (`opened`)."""

import asyncio
import secrets
import threading
from collections.abc import Callable
from typing import Any

import pytest

from services.runtime.storage.objectstore import UPLOAD_PART_BYTES, ObjectNotFound, ObjectStore


class HeldCalls:
    """The store's blocking calls held in their thread until let through, so a caller can give up while one is under
    way (the thread goes on with it, as a real call does)."""

    def __init__(self, store: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.arrived, self.go, self.ended = asyncio.Event(), threading.Event(), asyncio.Event()
        loop, real = asyncio.get_running_loop(), store.run

        def at_the_door(call: Callable[..., Any], *args: Any) -> Any:
            loop.call_soon_threadsafe(self.arrived.set)
            self.go.wait(10)
            try:
                return call(*args)
            finally:
                loop.call_soon_threadsafe(self.ended.set)

        async def held(call: Callable[..., Any], *args: Any) -> Any:
            return await real(at_the_door, call, *args)

        monkeypatch.setattr(store, "run", held)


async def given_up_during(step: "asyncio.Future[Any]", held: HeldCalls) -> None:
    await asyncio.wait_for(held.arrived.wait(), 10)
    step.cancel()
    with pytest.raises(asyncio.CancelledError):
        await step
    held.go.set()


async def test_a_multipart_upload_being_created_as_its_caller_gives_up_is_aborted(
        object_store: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> None:
    key = f"files/given-up-{secrets.token_hex(4)}.jsonl"
    upload = object_store.writer(key, "application/jsonl")
    held = HeldCalls(object_store, monkeypatch)
    await given_up_during(asyncio.ensure_future(upload.write(b"x" * UPLOAD_PART_BYTES)), held)
    await upload.abort()
    monkeypatch.undo()
    listed = await object_store.run(object_store.client._list_multipart_uploads, object_store.bucket, None, None,
                                    None, None, key)
    assert upload.upload_id is not None, "the upload was created after its caller gave up"
    assert [u.upload_id for u in listed.uploads] == []


@pytest.mark.parametrize("size", [10, UPLOAD_PART_BYTES + 10], ids=["one put", "multipart"])
async def test_an_object_whose_last_call_was_under_way_as_its_caller_gave_up_is_removed(
        object_store: ObjectStore, monkeypatch: pytest.MonkeyPatch, size: int) -> None:
    key = f"files/given-up-{secrets.token_hex(4)}.jsonl"
    upload = object_store.writer(key, "application/jsonl", own_key=True)
    await upload.write(b"x" * size)
    held = HeldCalls(object_store, monkeypatch)
    await given_up_during(asyncio.ensure_future(upload.finish()), held)
    await upload.abort()
    await asyncio.wait_for(held.ended.wait(), 10)  # the call its caller gave up on has ended, one way or the other
    monkeypatch.undo()
    with pytest.raises(ObjectNotFound):
        await object_store.size_of(key)


async def test_a_read_given_up_while_its_response_opens_releases_the_response(
        object_store: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> None:
    key = f"files/read-given-up-{secrets.token_hex(4)}.jsonl"
    await object_store.put_bytes(key, b"x" * 1000)
    responses: list[Any] = []
    open_object = object_store._open

    def recorded(key: str) -> Any:
        responses.append(open_object(key))
        return responses[-1]

    monkeypatch.setattr(object_store, "_open", recorded)
    held = HeldCalls(object_store, monkeypatch)
    await given_up_during(asyncio.ensure_future(anext(object_store.iter_chunks(key))), held)
    await asyncio.wait_for(held.ended.wait(), 10)
    await asyncio.sleep(0.1)  # the release is a callback of the open's end
    assert [response.closed for response in responses] == [True]
