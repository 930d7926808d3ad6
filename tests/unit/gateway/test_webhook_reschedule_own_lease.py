"""A webhook attempt that outlived its lease while the same gateway claimed the delivery again must not reschedule over
that second claim's lease (services/gateway/webhooks/store.py, `reschedule` with the attempt's own `lease`)."""

from dataclasses import dataclass, field

import nats.js.errors

from services.gateway.webhooks.store import DUE, Claim, Due, WebhookStore


@dataclass
class Entry:
    value: bytes
    revision: int


@dataclass
class FakeBucket:
    entries: dict[str, Entry] = field(default_factory=dict)
    revision: int = 0

    async def get(self, key: str) -> Entry:
        if key not in self.entries:
            raise nats.js.errors.KeyNotFoundError
        return self.entries[key]

    async def update(self, key: str, value: bytes, last: int) -> int:
        if self.entries[key].revision != last:
            raise nats.js.errors.KeyWrongLastSequenceError
        self.revision += 1
        self.entries[key] = Entry(value, self.revision)
        return self.revision


async def test_a_stale_attempt_of_this_gateway_leaves_its_later_claim_of_the_delivery_as_it_is() -> None:
    bucket = FakeBucket({f"{DUE}.d1": Entry(Due(endpoint_id="e1", not_before=0).model_dump_json().encode(), 1)}, 1)
    store = WebhookStore(bucket)  # type: ignore[arg-type]
    claim = Claim("d1", "e1")
    assert await store.claim(claim, 1, 10) is True
    first = store.lease_of(claim)
    assert await store.claim(claim, 600, 12) is True  # the first lease ran out: this gateway claims it again
    second = store.lease_of(claim)
    await store.reschedule(claim, 13, first)  # the first attempt ends late
    store.forget(claim, first)
    assert Due.model_validate_json(bucket.entries[f"{DUE}.d1"].value).not_before == 612, "second lease overwritten"
    await store.reschedule(claim, 15, second)  # the holder's own reschedule still takes
    assert Due.model_validate_json(bucket.entries[f"{DUE}.d1"].value).not_before == 15
