"""How often each batch's validation was started, kept on the broker: a validator killed while it checks a file, every
time, must some day give that batch up (failed), while the batches that waited beside it, handed out again by each
restart as often, are not counted (the delivery count cannot tell the two apart)."""

import nats.js.errors

from contracts.subjects import VALIDATIONS_BUCKET
from services.runtime.nats.bus import EventBus
from services.runtime.nats.kv import Bucket, open_bucket, read_entry

KEPT_S = 8 * 24 * 3600.0
"""Longer than any completion window: a batch not validated by then has expired."""
MAX_TRIES = 16


class ValidationStarts:
    def __init__(self, kv: Bucket) -> None:
        self.kv = kv

    @classmethod
    async def open(cls, bus: EventBus) -> "ValidationStarts":
        return cls(await open_bucket(bus, VALIDATIONS_BUCKET, KEPT_S))

    async def begun(self, batch_id: str) -> int:
        """Count one more start of the batch's validation (compare-and-set: two validators count twice); how many."""
        for _ in range(MAX_TRIES):
            entry = await read_entry(self.kv, batch_id)
            count = int(entry.value or b"0") + 1 if entry is not None else 1
            try:
                if entry is None:
                    await self.kv.create(batch_id, str(count).encode())
                else:
                    await self.kv.update(batch_id, str(count).encode(), last=entry.revision)
                return count
            except nats.js.errors.KeyWrongLastSequenceError:
                continue
        raise RuntimeError(f"the start count of batch {batch_id} changed {MAX_TRIES} times in a row")
