"""The expired-file sweeper finds expired files from the owners' stored-bytes summaries and reads only their records,
never every file record ever stored; its daily sweep through every record reads them a page at a time and decodes
whole only the expired ones. Against a real gateway, ledger, broker and store."""

import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from contracts.readmodel import FileRecord
from services.gateway.background import sweeper
from services.gateway.background.sweeper import sweep_expired_files
from services.gateway.context import DEPS
from services.gateway.usecases.files import is_expired
from services.runtime.process.settings import ConnectionSettings
from tests.integration.gateway_support import Gateway, jsonl, running_gateway

AN_HOUR = 3600


@pytest.fixture(scope="module")
async def gateway(connection: ConnectionSettings) -> AsyncIterator[Gateway]:
    async with running_gateway(connection) as running:
        yield running


async def upload(gateway: Gateway, key: dict[str, str], tag: str, **fields: str) -> str:
    answer = await gateway.upload(key, jsonl(tag), **fields)
    assert answer.status == 200
    return str((await answer.json())["id"])


@pytest.mark.parametrize("every_record", [False, True], ids=["from the summaries", "every record in small pages"])
async def test_a_sweep_deletes_every_expired_file_once_and_keeps_the_others(
        gateway: Gateway, monkeypatch: pytest.MonkeyPatch, every_record: bool) -> None:
    monkeypatch.setattr(sweeper, "SWEEP_PAGE", 2)
    if not every_record:
        monkeypatch.setattr(sweeper, "read_page", None)  # the summaries' sweep pages through no file records
    key = await gateway.new_key()
    short = [await upload(gateway, key, f"short-{i}", **{"expires_after[anchor]": "created_at",
                                                          "expires_after[seconds]": str(AN_HOUR)}) for i in range(5)]
    kept = [await upload(gateway, key, f"kept-{i}") for i in range(2)]
    deps = gateway.client.app[DEPS]
    later = time.time() + AN_HOUR + 1

    swept = await sweep_expired_files(deps, now=later, every_record=every_record)

    assert set(short) <= set(swept) and not set(kept) & set(swept)
    assert not set(short) & set(await sweep_expired_files(deps, now=later, every_record=every_record))
    for file_id in short:
        assert (await gateway.client.get(f"/v1/files/{file_id}", headers=key)).status == 404
    for file_id in kept:
        assert (await gateway.client.get(f"/v1/files/{file_id}", headers=key)).status == 200


@pytest.mark.parametrize("every_record", [False, True], ids=["from the summaries", "every record"])
async def test_a_sweep_decodes_whole_only_the_records_of_expired_files(
        gateway: Gateway, monkeypatch: pytest.MonkeyPatch, every_record: bool) -> None:
    key = await gateway.new_key()
    for i in range(3):
        await upload(gateway, key, f"not-expired-{i}")
    deps = gateway.client.app[DEPS]
    later = time.time() + AN_HOUR + 1
    await upload(gateway, key, "expiring", **{"expires_after[anchor]": "created_at",
                                              "expires_after[seconds]": str(AN_HOUR)})
    records = await deps.read_model.list_files()
    expired = [r for r in records if not r.deleted and is_expired(r, later)]
    decoded_by_the_sweep = [0]
    decode = FileRecord.model_validate_json

    def counted(cls: type[FileRecord], data: Any, **kwargs: Any) -> FileRecord:
        frames, frame = set(), sys._getframe(1)
        while frame is not None:
            frames.add(frame.f_code.co_name)
            frame = frame.f_back  # type: ignore[assignment]
        # The sweep's reading of the records, not the deletion's own read-your-writes lookups.
        if "sweep_expired_files" in frames and "delete_unless_in_use" not in frames:
            decoded_by_the_sweep[0] += 1
        return decode(data, **kwargs)

    monkeypatch.setattr(FileRecord, "model_validate_json", classmethod(counted))
    await sweep_expired_files(deps, now=later, every_record=every_record)

    assert len(records) > len(expired) >= 1
    assert decoded_by_the_sweep[0] == len(expired)
