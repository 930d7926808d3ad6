"""The overdrawn index holds the accounts that are or were overdrawn, never a marker per account: the credit sweep
scans `overdrawn.>` every 5 s on every gateway."""

from contracts.readmodel import AccountRecord
from contracts.subjects import OVERDRAWN, read_model_key
from services.runtime.nats.bus import EventBus
from services.runtime.nats.kv import read_subject
from services.runtime.nats.readmodel import ReadModel
from tests.conftest import RunningNats


def account(account_id: str, balance: int, sequence: int) -> AccountRecord:
    return AccountRecord(account_id=account_id, balance_micros=balance, reserved_micros=0,
                         open_batch_ids=["batch_1"], last_sequence=sequence)


async def test_accounts_never_overdrawn_leave_nothing_to_scan_across_writers_and_an_overdraft_is_erased(
        fresh_nats: RunningNats) -> None:
    bus = await EventBus.connect(fresh_nats.url, "tests")
    try:
        first = await ReadModel.open(bus)
        for i in range(50):
            await first.put(read_model_key("account", f"org{i}"), account(f"org{i}", 100, 1))
        await first.put(read_model_key("account", "org-poor"), account("org-poor", -5, 1))
        assert await first.index_overdrawn() == 51  # the start's index pass: no marker either
        restarted = await ReadModel.open(bus)  # a ledger started again: it remembers nothing it wrote
        for i in range(50):
            await restarted.put(read_model_key("account", f"org{i}"), account(f"org{i}", 90, 2))
        assert [a.account_id for a in await restarted.overdrawn_accounts()] == ["org-poor"]
        scanned = await read_subject(bus.js, first.kv.stream, f"{first.kv.prefix}{OVERDRAWN}")
        assert len(scanned) == 1, [m.subject for m in scanned]

        await restarted.put(read_model_key("account", "org-poor"), account("org-poor", 5, 2))  # paid up
        assert await restarted.overdrawn_accounts() == []
        again = await ReadModel.open(bus)
        await again.put(read_model_key("account", "org-poor"), account("org-poor", -1, 3))
        fresh = await ReadModel.open(bus)
        await fresh.put(read_model_key("account", "org-poor"), account("org-poor", 1, 4))  # erased though unknown
        assert await fresh.overdrawn_accounts() == []
    finally:
        await bus.close()
