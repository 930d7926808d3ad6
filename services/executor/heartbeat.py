"""The executor's heartbeat: its advert in the TTL'd executors bucket, refreshed well inside the TTL. After a longer
silence (paused, cut off) its work was fenced: it registers again, a new fencing epoch, before beating on."""

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import nats.errors

from contracts.events.executor import ExecutorAdvert
from services.runtime.nats.fleet import ADVERT_TTL_S

log = logging.getLogger(__name__)

SILENCE_MS = int(ADVERT_TTL_S * 1000)
"""A gap between two heartbeats longer than this: the advert expired meanwhile."""

Rejoin = Callable[[ExecutorAdvert], Awaitable[bool]]
"""Register again with this advert; False when no scheduler answered (try again at the next beat)."""


class Advertiser(Protocol):
    """Where the executor's advert goes (`adapters.advert.OwnAdvert`): whether the leading scheduler counts the
    executor registered (None: not known)."""

    async def advertise(self, advert: ExecutorAdvert) -> bool | None: ...


async def heartbeat(fleet: Advertiser, advert_now: Callable[[], ExecutorAdvert], every_s: float, stop: asyncio.Event,
                    rejoin: Rejoin | None = None) -> None:
    """Advertise every `every_s` until `stop` is set; after too long a silence, `rejoin` first."""
    last_beat_at: int | None = None
    owes_rejoin = False
    while not stop.is_set():
        advert = advert_now()
        silent_ms = advert.heartbeat_at - last_beat_at if last_beat_at is not None else 0
        if rejoin is not None and not owes_rejoin and silent_ms > SILENCE_MS:
            log.warning("no heartbeat sent for %.1f s (paused or cut off): registering again", silent_ms / 1000)
            owes_rejoin = True
        try:
            # Beating before the new registration lands would let the scheduler assign work the registration fences.
            if owes_rejoin and rejoin is not None:
                owes_rejoin = not await rejoin(advert)
            if not owes_rejoin:
                registered = await fleet.advertise(advert)
                last_beat_at = advert.heartbeat_at
                if registered is False and rejoin is not None:
                    log.warning("the leading scheduler counts this executor lost: registering again")
                    owes_rejoin = True
        except nats.errors.NoRespondersError:
            # No scheduler runs (its adverts are written through one), so none can take it for lost: this silence
            # is no reason to register again (a new epoch would fence the work in hand). Should a leader have taken
            # it for lost meanwhile (a partition), the first advert it answers says so.
            last_beat_at = advert.heartbeat_at
        except (nats.errors.Error, OSError) as error:
            # A missed beat is survivable (the advert outlives several); the broker may be reconnecting.
            log.warning("heartbeat not sent: %r", error)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)
