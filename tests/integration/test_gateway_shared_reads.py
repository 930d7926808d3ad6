"""A burst of one owner's list pages reads (and decodes) the owner's index of files once for all of them, not once per
request: what a burst holds in memory is one copy of the owner's records, whatever the number of requests in flight.
Uploads read no index at all (the owner's stored bytes and files by digest instead). Against a real gateway, ledger,
broker and object store."""

import asyncio
from collections.abc import Callable

import pytest

from contracts.readmodel import FileRecord
from services.gateway import views
from services.gateway.context import DEPS, Deps
from services.runtime.nats.readmodel import ReadModel
from services.runtime.process.settings import ConnectionSettings
from tests.integration.gateway_support import jsonl, running_gateway

REQUESTS = 12


async def until(condition: Callable[[], bool], what: str) -> None:
    for _ in range(3000):  # a wait for a state, however slow the machine: not a measure of time
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


async def test_list_pages_of_one_owner_in_flight_together_share_one_read_of_the_owners_files(
        connection: ConnectionSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    async with running_gateway(connection) as gateway:
        key = await gateway.new_key()
        uploaded = await gateway.upload(key, jsonl("before"))
        assert uploaded.status == 200
        gate, reads, asked = asyncio.Event(), [0], [0]
        read_owner_files, owner_files = ReadModel.owner_files, views.files.owner_files

        async def gated_owner_files(self: ReadModel, owner: str) -> list[FileRecord]:
            reads[0] += 1
            await gate.wait()
            return await read_owner_files(self, owner)

        async def counted_owner_files(d: Deps, owner: str) -> list[FileRecord]:
            asked[0] += 1  # the list asks the shared reads next, without a pause between
            return await owner_files(d, owner)

        monkeypatch.setattr(ReadModel, "owner_files", gated_owner_files)
        monkeypatch.setattr(views.files, "owner_files", counted_owner_files)
        pages = [asyncio.create_task(gateway.client.get("/v1/files", headers=key)) for _ in range(REQUESTS)]
        await until(lambda: asked[0] == REQUESTS and reads[0] >= 1, "every list asked for the owner's files")

        assert reads[0] == 1  # one read under way; the other pages wait for the one after it, together
        gate.set()
        answers = await asyncio.gather(*pages)
        assert [answer.status for answer in answers] == [200] * REQUESTS
        file_id = (await uploaded.json())["id"]
        assert [[f["id"] for f in (await answer.json())["data"]] for answer in answers] == [[file_id]] * REQUESTS
        assert gateway.client.app[DEPS].shared_reads.in_flight() == 0  # nothing kept once the requests ended


async def test_uploads_of_one_owner_read_none_of_the_owners_files(
        connection: ConnectionSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    async with running_gateway(connection, upload_slots=REQUESTS, upload_slots_per_owner=REQUESTS) as gateway:
        key = await gateway.new_key()
        first = await gateway.upload(key, jsonl("same"))
        assert first.status == 200
        reads = [0]
        read_owner_files = ReadModel.owner_files

        async def counted(self: ReadModel, owner: str) -> list[FileRecord]:
            reads[0] += 1
            return await read_owner_files(self, owner)

        monkeypatch.setattr(ReadModel, "owner_files", counted)
        answers = await asyncio.gather(*(gateway.upload(key, jsonl(f"burst-{i}")) for i in range(REQUESTS)))
        again = await gateway.upload(key, jsonl("same"))

        assert [answer.status for answer in answers] == [200] * REQUESTS
        assert (await again.json())["id"] == (await first.json())["id"]  # the same upload, found by its digest
        assert reads[0] == 0
