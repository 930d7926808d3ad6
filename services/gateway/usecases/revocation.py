"""Revoking a key: the fact, then a cancel with `authorization_revoked` for each batch of the key not ended yet.

Shared by the admin route and `sheshnag keys revoke`; publishing twice is harmless (deduplicated facts).
"""

from contracts.events.batch import BatchCancelRequested
from contracts.events.key import KeyRevoked
from contracts.ids import key_aggregate_id
from contracts.lifecycle import TERMINAL
from contracts.subjects import batch_fact
from services.runtime.nats.bus import EventBus, Fence, FenceMoved
from services.runtime.nats.readmodel import ReadModel

ENDED = TERMINAL | {"cancelling"}
"""Batches a revocation leaves alone: ended, or ending already for a cancel of their own."""


async def revoke_key(bus: EventBus, read_model: ReadModel, key_sha256: str, by_key_id: str | None) -> list[str]:
    """Revoke the key and stop its live batches; return the ids of the batches told to stop."""
    record = await read_model.get_api_key(key_sha256)
    if record is None:
        raise LookupError(key_sha256)
    if not record.revoked:
        await bus.publish(KeyRevoked(aggregate_id=key_aggregate_id(record.key_id, key_sha256),
                                     key_sha256=key_sha256, revoked_by_key_id=by_key_id))
    live = [r.batch.id for r in await read_model.owner_live_batches(record.owner)  # its owner's live list alone
            if r.owner_key_id == record.key_id and r.batch.status not in ENDED]
    told: list[str] = []
    for batch_id in live:
        try:  # as a user's cancel: only before it is finalizing (then it completes, its lines all ran)
            await bus.publish(BatchCancelRequested(
                aggregate_id=batch_id, requested_by_key_id=by_key_id or "operator",
                code="authorization_revoked", event_id=f"{batch_id}:cancel_requested:authorization_revoked"),
                fence=Fence(batch_fact(batch_id, "finalizing"), 0))
        except FenceMoved:
            continue
        told.append(batch_id)
    return told


async def find_key(read_model: ReadModel, key_id: str) -> tuple[str, str] | None:
    """The SHA-256 and role of the key with this public id."""
    for digest, record in await read_model.list_api_keys():
        if record.key_id == key_id:
            return digest, record.role
    return None
