"""Keeping the executor admitted to the broker: its auth callout JWT expires, so it reconnects (admitted afresh) a while
before, at a quiet moment; one that expires anyway (a pause) reconnects on the server's error (`ReadmittingClient`).
How long an admission lasts a scheduler says (`admission_asks`): the executor may ask the server nothing itself
(`services/authz/relay.py`), so it counts from its own connection's last connect."""

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import nats.errors
from nats.aio.client import Client

from contracts.commands import AdmissionAsk, AdmissionTerms
from contracts.subjects import admission_asks
from services.runtime.nats.client import ReadmittingClient

log = logging.getLogger(__name__)

RENEW_SHARE = 0.25
"""Renew once this share of the admission's lifetime is left…"""
RENEW_MARGIN_S = 60.0
"""…but no earlier than this before it expires."""
QUIET_WAIT_S = 5.0
"""How long a renewal waits for the requests in flight to be answered (their replies die with the connection)."""
ASK_TIMEOUT_S = 5.0
RECHECK_S = 300.0
"""How often to ask again when the server says the connection never expires."""
RETRY_S = 2.0
"""How soon to ask again when the server did not answer."""
FAILURES_PER_WARNING = 30
RECONNECT_WAIT_S = 30.0


def renew_in(expires_in_s: float) -> float:
    return max(0.0, expires_in_s - min(RENEW_MARGIN_S, expires_in_s * RENEW_SHARE))


async def expires_in(nc: Client, executor_id: str) -> float | None:
    """Seconds the connection's admission has left (counted from its last connect); None: it never expires."""
    reply = await nc.request(admission_asks(executor_id), AdmissionAsk().model_dump_json().encode(),
                             timeout=ASK_TIMEOUT_S)
    ttl_s = AdmissionTerms.model_validate_json(reply.data).ttl_s
    connected_at = nc.connected_at if isinstance(nc, ReadmittingClient) else None
    if ttl_s is None or connected_at is None:
        return None
    return max(0.0, ttl_s - (time.monotonic() - connected_at))


async def would_be_admitted(nc: Client) -> bool:
    """Whether the broker admits these credentials now, on a probe (renewing while it would not cuts us off early)."""
    url = nc.connected_url
    if url is None:
        return False
    # the connection's own TLS, TLS first included: the probe sends the worker key no sooner than it does
    options = {name: nc.options[name] for name in ("user", "password", "tls", "tls_handshake_first")
               if nc.options.get(name)}
    probe = Client()
    try:
        await probe.connect(servers=[url.geturl()], allow_reconnect=False, max_reconnect_attempts=0,
                            connect_timeout=int(ASK_TIMEOUT_S), error_cb=_quiet, **options)
    except (nats.errors.Error, OSError, TimeoutError):
        return False
    await probe.close()
    return True


async def _quiet(error: Exception) -> None:
    log.debug("admission probe: %r", error)


async def renew(nc: Client) -> None:
    """Reconnect (admitted again) once no request waits for its reply (its reply would die), or after a while."""
    await _until(lambda: not nc._resp_map, QUIET_WAIT_S)  # nats-py's requests awaiting a reply
    await nc.force_reconnect()
    await _until(lambda: nc.is_connected or nc.is_closed, RECONNECT_WAIT_S)


async def _until(condition: Callable[[], bool], within_s: float, every_s: float = 0.02) -> None:
    for _ in range(max(1, int(within_s / every_s))):
        if condition():
            return
        await asyncio.sleep(every_s)


async def keep_admitted(nc: Client, executor_id: str, stop: asyncio.Event) -> None:
    failures = 0
    while not stop.is_set():
        try:
            left = await expires_in(nc, executor_id)
        except (nats.errors.Error, OSError, ValueError) as error:
            # Reconnecting, or not allowed to ask: ask again soon (an expired admission still reconnects).
            if failures % FAILURES_PER_WARNING == 0:
                log.warning("cannot learn when this connection's admission to the broker expires: %r", error)
            failures += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), RETRY_S)
            continue
        failures = 0
        wait_s = RECHECK_S if left is None else renew_in(left)
        reconnects = nc.stats["reconnects"]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), wait_s)
            return
        if nc.stats["reconnects"] != reconnects or nc.is_reconnecting:
            # Reconnected meanwhile (a broker restart, an admission that expired during a pause): admitted afresh.
            await _until(lambda: nc.is_connected or nc.is_closed, RECONNECT_WAIT_S)
        elif left is not None and not await would_be_admitted(nc):
            log.warning("the broker would not admit this executor again now (no scheduler answers?); keeping the "
                        "current admission (%.1f s left) and asking again", left - wait_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), RETRY_S)
        elif left is not None:
            log.info("renewing this executor's admission to the broker (%.1f s before it expires)", left - wait_s)
            await renew(nc)
