"""The orphaned-object sweep against a real gateway, ledger, broker and S3 store: a file object the log holds no file
for (never stated, or deleted while its removal failed) is removed once older than any batch could need it; every
object of a live file, every young object and every name that is no file id stays."""

import secrets
import time
from collections.abc import AsyncIterator

import pytest

from contracts.subjects import input_object_key
from services.gateway.background import orphans
from services.gateway.background.orphans import ORPHAN_AGE_S, sweep_orphaned_objects
from services.gateway.context import DEPS
from services.runtime.process.settings import ConnectionSettings
from tests.integration.gateway_support import Gateway, jsonl, running_gateway


@pytest.fixture(scope="module")
async def gateway(connection: ConnectionSettings) -> AsyncIterator[Gateway]:
    async with running_gateway(connection) as running:
        yield running


async def uploaded(gateway: Gateway, key: dict[str, str], tag: str) -> str:
    answer = await gateway.upload(key, jsonl(tag))
    assert answer.status == 200, await answer.text()
    return str((await answer.json())["id"])


async def test_objects_no_file_holds_are_removed_once_old_and_every_other_object_stays(
        gateway: Gateway, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(orphans, "LIST_PAGE", 2)  # several pages
    deps, key = gateway.client.app[DEPS], await gateway.new_key()
    live = [await uploaded(gateway, key, f"live-{n}") for n in range(2)]
    deleted = await uploaded(gateway, key, "deleted")
    assert (await gateway.client.delete(f"/v1/files/{deleted}", headers=key)).status == 200
    await deps.store.put_bytes(input_object_key(deleted), b"{}\n")  # as if its removal had failed
    never_stated = [f"file-{secrets.token_hex(12)}" for _ in range(3)]
    for file_id in never_stated:
        await deps.store.put_bytes(input_object_key(file_id), b"{}\n")
    beside = input_object_key(f"{live[0]}.copy")  # as a retry's copy made twice at once leaves the unstated one
    await deps.store.put_bytes(beside, b"{}\n")
    not_an_id = input_object_key("notes/readme.txt")
    await deps.store.put_bytes(not_an_id, b"x")

    gone = {input_object_key(f) for f in (deleted, *never_stated)} | {beside}
    assert not gone & set(await sweep_orphaned_objects(deps)), "young objects stay"
    removed = await sweep_orphaned_objects(deps, now=time.time() + ORPHAN_AGE_S + 60)

    assert gone <= set(removed)
    left = set(await deps.store.list_keys(input_object_key("")))
    assert {input_object_key(f) for f in live} | {not_an_id} <= left and not gone & left
    for file_id in live:
        content = await gateway.client.get(f"/v1/files/{file_id}/content", headers=key)
        assert content.status == 200, await content.text()
