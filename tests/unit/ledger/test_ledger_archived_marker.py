"""A ledger starting while a clustered broker elects the read model's leader asks again for the archived marker
instead of crashing on its first `no responders`; a broker that stays silent past the patience still fails."""

from typing import Any, cast

import nats.errors
import nats.js.errors
import pytest

from services.ledger.restore import archived_through
from services.runtime.nats.readmodel import ReadModel


class ElectingBucket:
    """A KV bucket that answers `no responders` `silent` times, then that the key is absent."""

    def __init__(self, silent: int) -> None:
        self.silent, self.asked = silent, 0

    async def get(self, key: str) -> Any:
        self.asked += 1
        if self.asked <= self.silent:
            raise nats.errors.NoRespondersError
        raise nats.js.errors.KeyNotFoundError


async def test_the_marker_is_asked_again_through_a_leader_election() -> None:
    bucket = ElectingBucket(silent=2)
    assert await archived_through(ReadModel(cast(Any, bucket)), patience_s=30) is None
    assert bucket.asked == 3


async def test_a_broker_silent_past_the_patience_still_fails() -> None:
    bucket = ElectingBucket(silent=1_000)
    with pytest.raises(nats.errors.NoRespondersError):
        await archived_through(ReadModel(cast(Any, bucket)), patience_s=0.5)
    assert 1 < bucket.asked < 1_000
