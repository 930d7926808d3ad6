"""Revoking a key: the fact, then (once the read model holds it) a cancel with `authorization_revoked` for each of its
batches not ended yet (shared by the admin route and `sheshnag keys revoke`; publishing twice is harmless)."""

from collections.abc import Awaitable, Callable

from contracts.events.batch import BatchCancelRequested, CancelCode
from contracts.events.key import KeyRevoked
from contracts.ids import key_aggregate_id
from contracts.lifecycle import TERMINAL
from contracts.readmodel import ApiKeyRecord
from contracts.subjects import batch_fact
from services.runtime.nats.bus import EventBus, Fence, FenceMoved
from services.runtime.nats.readmodel import ReadModel

ENDED = TERMINAL | {"cancelling"}
"""Batches a revocation leaves alone: ended, or ending already for a cancel of their own."""


FOLD_WAIT_S = 10.0
"""How long a revocation waits for the read model to hold every batch created before it, by default."""
Folded = Callable[[int], Awaitable[object]]
"""Returns once the read model holds every fact through a stream sequence (or has waited its longest)."""


async def revoke_key(bus: EventBus, read_model: ReadModel, key_sha256: str, by_key_id: str | None) -> list[str]:
    """Revoke the key and stop its live batches; return the ids of the batches told to stop."""
    return (await revoke(bus, read_model, key_sha256, by_key_id))[1]


async def revoke(bus: EventBus, read_model: ReadModel, key_sha256: str, by_key_id: str | None,
                 folded: Folded | None = None) -> tuple[int | None, list[str]]:
    """`revoke_key`, with the stream sequence of the revocation stated now (None: the key was revoked already). The
    key's live batches are listed once the read model holds the revocation (`folded`, by default until it shows the
    key revoked): a create is stated only before its key's revocation (it is fenced on it), so every batch of the
    key is listed, however far the ledger lagged."""
    record = await read_model.get_api_key(key_sha256)
    if record is None:
        raise LookupError(key_sha256)
    sequence = None
    if not record.revoked:
        sequence = await bus.publish(KeyRevoked(aggregate_id=key_aggregate_id(record.key_id, key_sha256),
                                                key_sha256=key_sha256, revoked_by_key_id=by_key_id))
        await (folded(sequence) if folded is not None else read_model.wait_for(
            lambda: read_model.get_api_key(key_sha256), lambda record: record.revoked, FOLD_WAIT_S))
    live = [r.batch.id for r in await read_model.owner_live_batches(record.owner)  # its owner's live list alone
            if r.owner_key_id == record.key_id and r.batch.status not in ENDED]
    return sequence, [batch_id for batch_id in live if await stop_batch(bus, batch_id, by_key_id or "operator",
                                                                        "authorization_revoked")]


async def stop_batch(bus: EventBus, batch_id: str, by_key_id: str, code: CancelCode) -> bool:
    """Whether a live batch was told to stop, its lines not run ending with `code` (only before it is finalizing)."""
    try:
        await bus.publish(BatchCancelRequested(aggregate_id=batch_id, requested_by_key_id=by_key_id, code=code),
                          fence=Fence(batch_fact(batch_id, "finalizing"), 0))
    except FenceMoved:
        return False
    return True


async def find_key(read_model: ReadModel, key_id: str, *, everywhere: bool = False
                   ) -> tuple[str, ApiKeyRecord] | None:
    """The SHA-256 and record of the key with this public id, read by its id; `everywhere` (an admin's revocation):
    one not filed under its id (a ledger of an older version folded it) is looked for among every key."""
    found = await read_model.find_api_key(key_id)
    if found is None and everywhere:
        found = next(((digest, r) for digest, r in await read_model.list_api_keys() if r.key_id == key_id), None)
    return found
