"""A standby ledger's records go out only while it is sure it holds its lease: one paused past it may have been
replaced, and its records, folded from an older point of the log, would put newer ones back as they were."""

import time
from typing import cast

import pytest
from nats.js.kv import KeyValue

from services.ledger.app import LeaseLost, fenced
from services.ledger.projection import Projection
from services.runtime.nats.leader import LeaderLease


async def test_records_go_out_while_the_lease_is_renewed_and_are_refused_once_it_may_be_lost() -> None:
    written: list[list[Projection]] = []

    async def sink(projections: list[Projection]) -> None:
        written.append(projections)

    lease = LeaderLease(cast(KeyValue, None), "ledger-a", ttl_s=6.0)
    lease.renewed_at = time.monotonic()
    write = fenced(sink, lease)
    await write([])
    assert written == [[]]
    lease.renewed_at = time.monotonic() - 5.0  # past three quarters of the TTL without a renewal
    with pytest.raises(LeaseLost):
        await write([])
    assert written == [[]]


async def test_a_ledger_without_a_lease_writes_as_ever() -> None:
    async def sink(projections: list[Projection]) -> None:
        return None

    assert fenced(sink, None) is sink
