"""The executor's own advert in the executors bucket: on a broker without admissions written as plain JetStream
publishes to its key's subject (what a KV put and delete are), so it needs no look at the bucket's stream; an admitted
executor hands it to a scheduler, which writes it under its key (it may ask JetStream nothing itself:
`services/authz/relay.py`)."""

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js.client import JetStreamContext

from contracts.commands import AdvertReceipt, AdvertUpdate
from contracts.events.executor import ExecutorAdvert
from contracts.subjects import EXECUTORS_BUCKET, advert_updates, executor_advert
from services.runtime.nats.bus import EventBus
from services.runtime.nats.fleet import ADVERT_TTL_S
from services.runtime.nats.kv import KV_OPERATION, open_bucket

log = logging.getLogger(__name__)

BUCKET_WAIT_S = 60.0
"""How long the first advert waits for the executors bucket to exist."""
FIRST_ADVERT_RETRY_S = 2.0
ANSWER_TIMEOUT_S = 5.0


class AdvertNotStored(nats.errors.Error):
    """The scheduler did not store the advert (it says why)."""


class OwnAdvert:
    """Written by the executor itself (a broker without admissions)."""

    def __init__(self, js: JetStreamContext, executor_id: str) -> None:
        self.js = js
        self.subject = executor_advert(executor_id)

    @classmethod
    async def open(cls, bus: EventBus, executor_id: str, *, admitted: bool) -> "OwnAdvert":
        """`admitted`: the broker asked who the executor is (it may not touch the bucket; its scheduler made it)."""
        if admitted:
            return RelayedAdvert(bus.nc, bus.js, executor_id)
        await open_bucket(bus, EXECUTORS_BUCKET, ADVERT_TTL_S)
        return cls(bus.js, executor_id)

    async def advertise(self, advert: ExecutorAdvert) -> bool | None:
        """Write the advert, asking again for a while as long as the bucket does not exist yet. Whether the leading
        scheduler counts this executor registered (None: not known)."""
        deadline = time.monotonic() + BUCKET_WAIT_S
        while True:
            try:
                return await self._write(advert)
            except (nats.errors.NoRespondersError, nats.js.errors.NoStreamResponseError):
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(0.5)

    async def _write(self, advert: ExecutorAdvert | None) -> bool | None:
        if advert is None:
            await self.js.publish(self.subject, headers={KV_OPERATION: "DEL"})
        else:
            await self.js.publish(self.subject, advert.model_dump_json().encode())
        return None

    async def advertise_first(self, advert_now: Callable[[], ExecutorAdvert],
                              stop: asyncio.Event) -> ExecutorAdvert | None:
        """The first advert (made afresh for each try), asked again until the broker takes it, or None once the
        executor stops first: a broker that cannot write (its disk full, a leader election) is waited out here, not
        answered by a crash and a restart."""
        while not stop.is_set():
            advert = advert_now()
            try:
                await self.advertise(advert)
                return advert
            except (nats.errors.TimeoutError, nats.errors.ConnectionClosedError, nats.errors.StaleConnectionError,
                    nats.errors.NoRespondersError, nats.js.errors.NoStreamResponseError,
                    nats.js.errors.ServiceUnavailableError, AdvertNotStored) as error:
                # No scheduler yet (an admitted executor's advert is written through one), or no bucket yet.
                log.warning("first advert not taken (%r); asked again in %.0fs", error, FIRST_ADVERT_RETRY_S)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), FIRST_ADVERT_RETRY_S)
        return None

    async def withdraw(self) -> None:
        await self._write(None)


class RelayedAdvert(OwnAdvert):
    """Handed to a scheduler, which writes it under the executor's own key (whatever id the advert names)."""

    def __init__(self, nc: Client, js: JetStreamContext, executor_id: str) -> None:
        super().__init__(js, executor_id)
        self.nc = nc
        self.updates = advert_updates(executor_id)

    async def advertise(self, advert: ExecutorAdvert) -> bool | None:
        """Handed to the leading scheduler once: with none, `NoRespondersError` at once (the heartbeat beats again)."""
        return await self._write(advert)

    async def _write(self, advert: ExecutorAdvert | None) -> bool | None:
        reply = await self.nc.request(self.updates, AdvertUpdate(advert=advert).model_dump_json().encode(),
                                      timeout=ANSWER_TIMEOUT_S)
        receipt = AdvertReceipt.model_validate_json(reply.data)
        if not receipt.stored:
            raise AdvertNotStored(receipt.reason or "the scheduler did not store the advert")
        return receipt.registered
