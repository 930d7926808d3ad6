"""The webhook deliverer: every `webhook_poll_interval_s` the due deliveries are claimed and POSTed, signed, taken
fairly (`fairness.py`) and only to allowed addresses (`targets.py`); a 2xx ends one `delivered`, anything else is
retried after the next of `webhook_retry_delays_s`, then `failed`. An attempt cut short by a stop is claimed again by
the next gateway, with the same `webhook-id`."""

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web
from yarl import URL

from contracts.api.webhook import DeliveryAttempt, WebhookDelivery, WebhookEndpoint
from services.gateway.background.loops import every, running
from services.gateway.context import DEPS
from services.gateway.settings import GatewaySettings
from services.gateway.webhooks.directory import EndpointDirectory
from services.gateway.webhooks.domain import is_success, retry_delay
from services.gateway.webhooks.due_queue import DueQueue
from services.gateway.webhooks.fairness import Fairness
from services.gateway.webhooks.signing import signed_headers
from services.gateway.webhooks.store import Claim, WebhookStore
from services.gateway.webhooks.targets import (
    REFUSED,
    AddressPolicy,
    PolicyResolver,
    RefusedAddress,
    literal_address,
    parse_networks,
)
from services.runtime.process import metrics
from services.runtime.process.tasks import cancel_and_join

log = logging.getLogger(__name__)

WEBHOOK_STORE = web.AppKey("webhook_store", WebhookStore)
WEBHOOK_DIRECTORY = web.AppKey("webhook_directory", EndpointDirectory)
CLAIM_MARGIN_S = 30.0
"""A claim outlasts the attempt's timeout by this much (recording it), after which another gateway may take it."""
PRUNE_INTERVAL_S = 3600.0
"""How often a gateway erases the ended deliveries past their retention."""
HAND_BACK_S = 1.5
"""How long a gateway stopping mid-attempt spends handing its claim back (less than a re-cancel's wait)."""
MAX_ANSWER_BYTES = 64 * 1024
"""What is read of an endpoint's answer (and dropped): its status is what counts."""


async def prune(settings: GatewaySettings, store: WebhookStore) -> None:
    """Erase ended deliveries past their retention (every gateway does; erasing one twice is harmless)."""
    erased = await store.prune(time.time() - settings.webhook_retention_days * 86400)
    if erased:
        log.info("erased %d webhook deliveries older than %g days", erased, settings.webhook_retention_days)


class Attempts:
    """The attempts loop of one gateway, with its tasks (each released when it ends or the gateway stops)."""

    def __init__(self, settings: GatewaySettings, store: WebhookStore, due: DueQueue,
                 session: aiohttp.ClientSession, policy: AddressPolicy) -> None:
        self.settings = settings
        self.store = store
        self.due = due
        self.session = session
        self.policy = policy
        self.fairness = Fairness(settings.webhook_owner_concurrency, settings.webhook_endpoint_concurrency,
                                 settings.webhook_breaker_failures, settings.webhook_breaker_cooldown_s)
        self.running: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        try:
            await every(self.settings.webhook_poll_interval_s, self.start_due, "looking for due webhook deliveries",
                        at_once=True)
        finally:
            await cancel_and_join(self.running)

    async def start_due(self) -> int:
        """Claim and start the deliveries due now, fairly, up to the free concurrency; how many were started."""
        free = self.settings.webhook_concurrency - len(self.running)
        if free <= 0 or not self.due.ready.is_set():
            return 0
        now, started = time.time(), 0
        lease = self.settings.webhook_timeout_s + CLAIM_MARGIN_S
        for claim, owner in self.due.offered(now):
            if started >= free:
                break
            if not self.fairness.may_start(claim.endpoint_id, owner, now):
                continue
            taken = await self.store.claim(claim, lease, now)
            if taken is None:  # ended by another gateway (its entry erased, which a watch does not see)
                self.due.forget(claim.delivery_id)
            elif taken:
                self.fairness.started(claim.endpoint_id, owner)
                task = asyncio.create_task(self.attempt(claim, owner, self.store.lease_of(claim)))
                self.running.add(task)
                task.add_done_callback(self.running.discard)
                started += 1
        return started

    async def attempt(self, claim: Claim, owner: str, lease: int | None = None) -> None:
        succeeded: bool | None = None
        try:
            succeeded = await self._attempt(claim, lease)
        except asyncio.CancelledError:
            await self._hand_back(claim, lease)
            raise
        except Exception:
            log.exception("webhook delivery %s: the attempt could not be recorded; its claim lapses and it is "
                          "tried again", claim.delivery_id)
        finally:
            self.store.forget(claim, lease)
            self.fairness.ended(claim.endpoint_id, owner, succeeded, time.time())

    async def _hand_back(self, claim: Claim, lease: int | None) -> None:
        """The gateway stops mid-attempt: the claim is made due now (if still this attempt's own), so another gateway
        tries it at once rather than after the lease lapses (at least once: the endpoint may have had it already).
        Bounded: a broker that does not answer leaves the claim to lapse."""
        try:
            await asyncio.wait_for(self.store.reschedule(claim, time.time(), lease), HAND_BACK_S)
        except (asyncio.CancelledError, Exception) as why:
            log.info("webhook delivery %s: its claim was not handed back on stopping (%r); it lapses instead",
                     claim.delivery_id, why)

    async def _attempt(self, claim: Claim, lease: int | None = None) -> bool | None:
        """One attempt, recorded; whether the endpoint took it (None: none was made)."""
        delivery = await self.store.get_delivery(claim.endpoint_id, claim.delivery_id)
        if delivery is None or delivery.status != "pending":
            await self._finish(claim)
            return None
        endpoint = await self.store.get_endpoint(claim.endpoint_id)
        if endpoint is None or not endpoint.enabled:
            why = "the endpoint was deleted" if endpoint is None else "the endpoint is disabled"
            await self._end(claim, delivery, DeliveryAttempt(attempted_at=time.time(), status_code=None, error=why,
                                                             duration_ms=0), "failed")
            return None
        attempt = await self.post(endpoint, delivery)
        metrics.WEBHOOK_ATTEMPTS.labels("delivered" if attempt.error is None else "failed").inc()
        if attempt.error is None:
            await self._end(claim, delivery, attempt, "delivered")
            return True
        delay = retry_delay(len(delivery.attempts) + 1, self.settings.webhook_retry_delays_s)
        if delay is None:
            log.warning("webhook delivery %s to %s failed %d times; given up: %s", delivery.id, endpoint.url,
                        len(delivery.attempts) + 1, attempt.error)
            await self._end(claim, delivery, attempt, "failed")
            return False
        due = time.time() + delay
        await self._record(delivery, attempt, {"next_attempt_at": due})
        await self.store.reschedule(claim, due, lease)
        return False

    async def _end(self, claim: Claim, delivery: WebhookDelivery, attempt: DeliveryAttempt, status: str) -> None:
        await self._record(delivery, attempt, {"status": status, "next_attempt_at": None})
        await self._finish(claim)

    async def _finish(self, claim: Claim) -> None:
        await self.store.finish(claim)
        self.due.forget(claim.delivery_id)  # its entry is erased: no watch says so
        await self.store.due_if_pending(claim)  # a redelivery asked meanwhile (the watch brings its entry back)

    async def _record(self, delivery: WebhookDelivery, attempt: DeliveryAttempt, update: dict[str, object]) -> None:
        """The attempt added to the delivery as stored now (compare-and-set), with `update`."""
        def recorded(stored: WebhookDelivery) -> WebhookDelivery:
            return stored.model_copy(update={"attempts": [*stored.attempts, attempt], **update})

        await self.store.change_delivery(delivery.endpoint_id, delivery.id, recorded)

    async def post(self, endpoint: WebhookEndpoint, delivery: WebhookDelivery) -> DeliveryAttempt:
        """One signed POST, only to an allowed address (names checked by the session's resolver); its outcome."""
        body = delivery.event.model_dump_json().encode()
        started = time.time()
        headers = signed_headers(endpoint.secret or "", delivery.id, int(started), body)
        status: int | None = None
        error: str | None = None
        timeout = aiohttp.ClientTimeout(total=self.settings.webhook_timeout_s,
                                        sock_connect=self.settings.webhook_connect_timeout_s)
        host = URL(endpoint.url).host or ""
        if literal_address(host) and not self.policy.allows(host):
            return DeliveryAttempt(attempted_at=started, status_code=None, error=REFUSED, duration_ms=0)
        try:
            async with self.session.post(endpoint.url, data=body, headers=headers, allow_redirects=False,
                                         timeout=timeout) as answer:
                status = answer.status
                await answer.content.read(MAX_ANSWER_BYTES)
            if not is_success(status):
                error = f"the endpoint answered HTTP {status}"
        except TimeoutError:
            error = f"no answer within {self.settings.webhook_timeout_s:g}s"
        except (aiohttp.ClientError, OSError, ValueError) as failure:
            error = REFUSED if _refused(failure) else f"could not reach the endpoint: {failure!r}"[:500]
        took_ms = 0 if error == REFUSED else int((time.time() - started) * 1000)  # nothing of a refused address
        return DeliveryAttempt(attempted_at=started, status_code=status, error=error, duration_ms=took_ms)


def _refused(failure: BaseException) -> bool:
    """Whether a connection failed because every address was refused (aiohttp wraps the resolver's error)."""
    causes = (failure, getattr(failure, "os_error", None), failure.__cause__)
    return any(isinstance(cause, RefusedAddress) for cause in causes)


async def webhook_deliverer(app: web.Application) -> AsyncIterator[None]:
    """A cleanup context: with `webhooks` on, the attempts and pruning loops on the store."""
    settings, store, directory = app[DEPS].settings, app[WEBHOOK_STORE], app[WEBHOOK_DIRECTORY]
    if not settings.webhooks:
        yield
        return
    due = DueQueue(owner_of=lambda endpoint_id: directory.owner_of(endpoint_id) or endpoint_id)
    policy = AddressPolicy(parse_networks(settings.webhook_allowed_cidrs))
    # Every attempt's session: host names resolve only to allowed addresses, no proxy from the environment, no
    # redirect followed (each POST says so).
    resolver = PolicyResolver(policy, nameservers=settings.webhook_nameservers)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(resolver=resolver), trust_env=False) as session:
        # Kept for ever (a retention of 0 days): the pruning loop never runs.
        pruning = every(PRUNE_INTERVAL_S if settings.webhook_retention_days > 0 else 0, lambda: prune(settings, store),
                        "erasing old webhook deliveries", at_once=True)
        async with running(due.follow(store.kv, directory.ready), Attempts(settings, store, due, session, policy).run(),
                           pruning):
            yield
