"""Why an executor cannot join (a refused worker key, an untrusted broker certificate, a refused registration), said
once per try, and the exponential back-off before the next; past `max_refusals` (when set) it gives up."""

import asyncio
import contextlib
import logging
import ssl

import nats.errors

log = logging.getLogger(__name__)

EXIT_REFUSED = 78
"""The exit status once it gives up (EX_CONFIG: its key or CA must change; the systemd unit does not restart on it)."""


class JoinRefused(RuntimeError):
    """The executor was refused `max_refusals` times in a row: it stops trying."""


def is_refusal(error: BaseException) -> bool:
    """The broker (its auth callout) refused the executor id and worker key."""
    return isinstance(error, nats.errors.AuthorizationError) or "authorization violation" in str(error).lower()


def explain(error: BaseException) -> str:
    """What an operator reads: the cause, and what to check."""
    if isinstance(error, ssl.SSLError):
        return (f"the TLS handshake with NATS failed ({error}): the broker's certificate is not signed by the CA "
                "this executor trusts (SHESHNAG_NATS_TLS_CA, else the system's CAs) or does not name the host in "
                "SHESHNAG_NATS_URL")
    if is_refusal(error):
        return ("NATS refused its executor id and worker key (Authorization Violation): the key is unknown, "
                "revoked or not a worker key, the executor id belongs to another provider, or no scheduler answers "
                "the broker's auth callout yet (the scheduler's log says which)")
    return str(error)


class Refusals:
    """Refusals in a row, tries spaced `first_s` doubling up to `max_s`; `JoinRefused` after `limit` (0: never)."""

    def __init__(self, executor_id: str, first_s: float, max_s: float, limit: int = 0) -> None:
        self.executor_id = executor_id
        self.first_s = first_s
        self.max_s = max_s
        self.limit = limit
        self.count = 0

    async def back_off(self, reason: str, stop: asyncio.Event) -> None:
        """Say why (one line), then wait before the next try, or until `stop`; `JoinRefused` past the limit."""
        self.count += 1
        if self.limit and self.count >= self.limit:
            log.error("executor %s cannot join, refusal %d of %d: %s; giving up", self.executor_id, self.count,
                      self.limit, reason)
            raise JoinRefused(f"executor {self.executor_id} was refused {self.count} times: {reason}")
        wait_s = min(self.max_s, self.first_s * 2 ** (self.count - 1))
        log.warning("executor %s cannot join (refusal %d): %s; trying again in %gs", self.executor_id,
                    self.count, reason, wait_s)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), wait_s)
