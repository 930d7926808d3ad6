"""A burst of one owner's uploads reads (and decodes) the owner's index of files once for all of them, not once per
upload: what a burst holds in memory is one copy of the owner's records, whatever the number of requests in flight.
Against a real gateway, ledger, broker and object store."""

import asyncio
from collections.abc import Callable

import pytest

from contracts.readmodel import FileRecord
from services.gateway import views
from services.gateway.context import DEPS
from services.runtime.nats.readmodel import ReadModel
from services.runtime.process.settings import ConnectionSettings
from tests.integration.gateway_support import jsonl, running_gateway

UPLOADS = 12


async def until(condition: Callable[[], bool], what: str) -> None:
    for _ in range(3000):  # a wait for a state, however slow the machine: not a measure of time
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


async def test_uploads_of_one_owner_in_flight_together_share_one_read_of_the_owners_files(
        connection: ConnectionSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    async with running_gateway(connection, upload_slots=UPLOADS, upload_slots_per_owner=UPLOADS) as gateway:
        key = await gateway.new_key()
        assert (await gateway.upload(key, jsonl("before"))).status == 200
        gate, reads, bodies_read = asyncio.Event(), [0], [0]
        owner_files, read_upload = ReadModel.owner_files, views.files._read_upload

        async def gated_owner_files(self: ReadModel, owner: str) -> list[FileRecord]:
            reads[0] += 1
            await gate.wait()
            return await owner_files(self, owner)

        async def counted_read_upload(*args: object) -> object:
            upload = await read_upload(*args)  # type: ignore[arg-type]
            bodies_read[0] += 1  # the create reads the owner's files next, without a pause between
            return upload

        monkeypatch.setattr(ReadModel, "owner_files", gated_owner_files)
        monkeypatch.setattr(views.files, "_read_upload", counted_read_upload)
        uploads = [asyncio.create_task(gateway.upload(key, jsonl(f"burst-{i}"))) for i in range(UPLOADS)]
        await until(lambda: bodies_read[0] == UPLOADS and reads[0] >= 1, "every upload stored its body")

        assert reads[0] == 1  # one read under way; the other uploads wait for the one after it, together
        gate.set()
        answers = await asyncio.gather(*uploads)
        assert [answer.status for answer in answers] == [200] * UPLOADS
        listed = await (await gateway.client.get("/v1/files?limit=100", headers=key)).json()
        assert {(await answer.json())["id"] for answer in answers} <= {file["id"] for file in listed["data"]}
        assert gateway.client.app[DEPS].shared_reads.in_flight() == 0  # nothing kept once the requests ended
