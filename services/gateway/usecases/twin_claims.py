"""Twin creates in flight: the very same create (no Idempotency-Key) sent twice at once, to any gateways, makes one
batch. Before it is stated, a create claims its parameters' digest in the limits bucket by compare-and-set; a twin
that finds the claim waits for that batch's `created` fact and is answered with that batch. A claim lives a minute
(by then the read model shows the batch, where the twin check of `batches.py` finds it), and a create refused after
claiming withdraws its claim at once, so a later twin does not wait on a batch that never came."""

import asyncio
import hashlib
import time
from dataclasses import dataclass

import nats.js.errors
import orjson

from contracts.events.batch import BatchCancelRequested, BatchCreated
from contracts.lifecycle import CANCELLABLE
from contracts.subjects import batch_fact
from services.gateway.adapters.shared_state import MAX_TRIES, SharedStateUnavailable, key_of, ttl_of
from services.gateway.context import Deps
from services.runtime.nats.facts import last_fact

CLAIM_TTL_S = 60.0
"""How long a claim stands unless withdrawn: a twin waits at most this long on a create whose gateway died."""
POLL_S = 0.05
CLAIM_CHECK_S = 0.2
"""How often a waiting twin reads the claim again (withdrawn: it waits no more)."""


@dataclass(frozen=True)
class Claim:
    """This create's claim on its parameters: the bucket key, and the revision its write made."""

    key: str
    revision: int


def claim_key(owner: str, asked: tuple[object, ...]) -> str:
    digest = hashlib.sha256(orjson.dumps(list(asked), option=orjson.OPT_SORT_KEYS)).hexdigest()
    return key_of("twin", owner, digest)


async def claim_or_twin(d: Deps, owner: str, asked: tuple[object, ...], batch_id: str,
                        ) -> Claim | BatchCreated | None:
    """Claim the create `asked` for `batch_id`: the claim; or the `created` fact of the live twin that claimed it
    first; None when the bucket cannot say now (the create goes on, checked against the read model alone)."""
    store, key = d.admission.store, claim_key(owner, asked)
    try:
        for _ in range(MAX_TRIES):
            raw, revision = await store.get_raw(key)
            if raw:
                claimer = raw.decode()
                if (twin := await _live_twin_created(d, key, claimer)) is not None:
                    return twin
                raw, revision = await store.get_raw(key)  # as it is now: withdrawn, lapsed, or another's
                if raw and raw.decode() != claimer:
                    continue  # another create claimed it meanwhile: wait for that one
            try:
                await store.put_raw(key, batch_id.encode(), ttl_of(CLAIM_TTL_S), revision)
            except nats.js.errors.KeyWrongLastSequenceError:
                continue  # another create claimed it meanwhile: see whose, and wait for it
            written = store.last_written(key)
            return Claim(key, written[1]) if written is not None else None
    except SharedStateUnavailable:
        return None
    return None


async def withdraw(d: Deps, claim: Claim) -> None:
    """Give the claim up (the create was refused before it was stated), unless another create took it over since."""
    try:
        await d.admission.store.put_raw(claim.key, b"", ttl_of(1), claim.revision)
    except (nats.js.errors.KeyWrongLastSequenceError, SharedStateUnavailable):
        pass  # taken over, or it lapses with its time to live


async def _live_twin_created(d: Deps, key: str, batch_id: str) -> BatchCreated | None:
    """The `created` fact of the batch that claimed `key`, waited for while its claim stands; None when the claim is
    withdrawn (its create was refused), lapses (its gateway died) or is taken over without the batch stated, or when
    the batch has ended or is being cancelled since (a new create is then a new batch)."""
    claim_read_at = time.monotonic()
    while (found := await last_fact(d.bus, batch_fact(batch_id, BatchCreated.name))) is None:
        if time.monotonic() - claim_read_at >= CLAIM_CHECK_S:
            raw, _ = await d.admission.store.get_raw(key)
            claim_read_at = time.monotonic()
            if raw is None or raw.decode() != batch_id:
                found = await last_fact(d.bus, batch_fact(batch_id, BatchCreated.name))  # stated, then let go?
                if found is None:
                    return None
                break
        await asyncio.sleep(POLL_S)
    if not isinstance(created := found[1], BatchCreated):
        return None
    record = await d.read_model.get_batch(batch_id)
    if record is not None and record.batch.status not in CANCELLABLE:
        return None
    if await last_fact(d.bus, batch_fact(batch_id, BatchCancelRequested.name)) is not None:
        return None
    return created
