"""Waiting for JetStream to place a stream or bucket. On a cluster's cold start, making a replicated stream is
answered 'insufficient resources', 'JetStream temporarily unavailable', no responders, or nothing at all, until
enough servers are up and a meta leader is elected: a starting service waits for that (saying so), rather than
crash for its supervisor to restart. Any other refusal is raised at once."""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats.errors
import nats.js.errors

log = logging.getLogger(__name__)

Placed = TypeVar("Placed")

FIRST_WAIT_S = 0.5
MAX_WAIT_S = 5.0
"""Tries are spaced from `FIRST_WAIT_S`, doubled each time, to at most this."""
SAY_EVERY_S = 30.0
"""While it waits, a service says so again this often."""
NOT_YET = (nats.js.errors.ServiceUnavailableError, nats.errors.NoRespondersError, nats.errors.TimeoutError,
           nats.errors.ConnectionReconnectingError)
"""What a cluster that cannot place a stream yet answers (10023 and 10008 are 503s), or a broker without JetStream."""


async def until_placed(what: str, make: Callable[[], Awaitable[Placed]]) -> Placed:
    """`make()`'s result, tried again while the cluster cannot place `what` yet; for as long as that takes (the
    process's stop ends it)."""
    began = time.monotonic()
    said_at: float | None = None
    wait_s = FIRST_WAIT_S
    while True:
        try:
            placed = await make()
        except NOT_YET as error:
            now = time.monotonic()
            if said_at is None or now - said_at >= SAY_EVERY_S:
                log.warning("%s cannot be created yet (%s): waiting for JetStream (on a cluster: enough servers up "
                            "for SHESHNAG_NATS_REPLICAS, and a meta leader elected)", what,
                            getattr(error, "description", None) or type(error).__name__)
                said_at = now
            await asyncio.sleep(wait_s)
            wait_s = min(MAX_WAIT_S, wait_s * 2)
            continue
        if said_at is not None:
            log.info("%s created after waiting %.0fs for the JetStream cluster", what, time.monotonic() - began)
        return placed
