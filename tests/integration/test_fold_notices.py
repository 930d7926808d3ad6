"""The ledger says how far its read model holds the log once the records are in it, and a gateway hears it: what a
gateway's read-back of its own upload or create waits for instead of polling (real broker, ledger and gateway)."""

import asyncio
import secrets

import nats.aio.msg

from contracts.events.key import KeyCreated
from contracts.ids import hash_api_key
from contracts.subjects import LEDGER_FOLDED, event_subject
from services.gateway.context import DEPS
from services.runtime.nats.facts import last_fact
from services.runtime.nats.readmodel import ReadModel
from services.runtime.process.settings import ConnectionSettings
from tests.integration.gateway_support import WAIT_S, jsonl, running_gateway


async def test_the_ledger_says_a_fact_is_folded_only_once_its_record_is_in_the_read_model(
        connection: ConnectionSettings) -> None:
    async with running_gateway(connection) as gateway:
        notices: asyncio.Queue[int] = asyncio.Queue()

        async def heard(message: nats.aio.msg.Msg) -> None:
            notices.put_nowait(int(message.data))
        await gateway.bus.nc.subscribe(LEDGER_FOLDED, cb=heard)
        await gateway.bus.nc.flush()
        digest = hash_api_key(f"gk-{secrets.token_hex(16)}")
        sequence = await gateway.bus.publish(KeyCreated(aggregate_id=digest[:32], key_sha256=digest, role="user",
                                                        label="notice"))
        while (through := await asyncio.wait_for(notices.get(), WAIT_S)) < sequence:
            pass
        assert through >= sequence
        assert await (await ReadModel.open(gateway.bus)).get_api_key(digest) is not None  # read once: it is there


async def test_a_gateway_hears_how_far_the_log_is_folded_past_its_own_upload(connection: ConnectionSettings) -> None:
    async with running_gateway(connection) as gateway:
        headers = await gateway.new_key()
        uploaded = await gateway.upload(headers, jsonl("a", "b"))
        assert uploaded.status == 200, await uploaded.text()
        file_id = (await uploaded.json())["id"]
        stored = await last_fact(gateway.bus, event_subject("file", file_id, "stored"))
        assert stored is not None
        folds = gateway.client.app[DEPS].folds
        for _ in range(int(WAIT_S / 0.05)):  # the notice may follow the answer (the read-back read on its own)
            if folds.through >= stored[0]:
                break
            await asyncio.sleep(0.05)
        assert folds.through >= stored[0]
