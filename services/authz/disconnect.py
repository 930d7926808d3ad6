"""Closing an executor's connections within moments (the system account's KICK), not when their admission expires:
once its key is revoked, or its id's registered owner does not admit its key; the callout refuses it when it returns.
Not on the scheduler's router: a system account connection of its own, open as long as the admissions it serves."""

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from contracts.events.executor import ExecutorRegistered
from contracts.events.key import KeyRevoked
from contracts.events.registry import decode_event
from contracts.subjects import (
    EXECUTOR_REGISTERED,
    KEY_REVOKED,
    SERVER_CONNECTS,
    SERVER_DISCONNECTS,
    SERVER_SHUTDOWNS,
    server_kick,
)
from services.runtime.nats.bus import EventBus
from services.scheduler.book import ExecutorOwner

log = logging.getLogger(__name__)

KICK_TIMEOUT_S = 2.0
KICK_ATTEMPTS = 3
"""A kick can race the connection's own admission (the server registers it once our answer is in): retried."""
KICK_RETRY_S = 0.3


@dataclass(frozen=True)
class Connection:
    """One client connection, as the server that holds it names it."""

    server_id: str
    client_id: int


CONFIRM_WITHIN_S = 30.0
"""An admission the server has not reported opened (its CONNECT event) within this long no longer counts toward its
holder's connections: the server gave up waiting for the answer, or the client went before it was in."""
PRUNE_EVERY, PRUNE_EVERY_S = 256, 60.0
"""A sweep of the connections past their expiry comes after this many admissions, or this long (it reads every
connection held)."""


@dataclass
class AdmittedConnections:
    """The connections each key (by SHA-256) was admitted on, and each executor id with whose key, until they close or
    their admission expires (a close the system account missed, while it reconnected, is forgotten then: the server
    ends a connection whose admission expired, and admits it again as a new one)."""

    by_key: dict[str, set[Connection]] = field(default_factory=dict)
    by_executor: dict[str, dict[Connection, tuple[str | None, str]]] = field(default_factory=dict)
    """Executor id → its connections, each with its key's provider and key id."""
    _held: dict[Connection, tuple[str, str | None, float]] = field(default_factory=dict)
    """Connection → its key's SHA-256, the executor id it claimed, and when its admission expires (monotonic)."""
    by_holder: dict[str, set[Connection]] = field(default_factory=dict)
    """Who answers for a connection's key (its provider, or the key itself) → its connections (`count`)."""
    _holder: dict[Connection, str] = field(default_factory=dict)
    _unconfirmed: dict[Connection, float] = field(default_factory=dict)
    """Connections admitted that the server has not reported opened yet → until when they count unconfirmed."""
    reconnects: Callable[[], int] = lambda: 0
    """How often the connection the server's reports come on has reconnected (`Disconnector` sets it)."""
    _reconnects_seen: int = 0
    _added: int = 0
    _pruned_at: float = 0.0

    def add(self, key_sha256: str, connection: Connection, ttl_s: float = float("inf")) -> None:
        self._added += 1
        now = time.monotonic()
        if self._added % PRUNE_EVERY == 0 or now - self._pruned_at >= PRUNE_EVERY_S:
            self._pruned_at = now
            self._forget_expired(now)
        self.by_key.setdefault(key_sha256, set()).add(connection)
        held = self._held.get(connection)
        self._held[connection] = (key_sha256, held[1] if held else None, now + ttl_s)
        if held is None:
            self._unconfirmed[connection] = now + CONFIRM_WITHIN_S

    def count(self, holder: str) -> int:
        """The holder's connections that are open, or admitted moments ago and not yet reported opened. Once the
        reports' connection has reconnected (closes may have gone unheard: a broker restarted), every connection counts
        only as if just admitted, until reported again: a cap that errs toward letting executors in."""
        now = time.monotonic()
        if (reconnects := self.reconnects()) != self._reconnects_seen:
            self._reconnects_seen = reconnects
            self._unconfirmed = dict.fromkeys(self._held, now + CONFIRM_WITHIN_S)
        return sum(1 for connection in self.by_holder.get(holder, ())
                   if self._unconfirmed.get(connection, now) >= now)

    def hold(self, holder: str, connection: Connection) -> None:
        """The connection counts toward `holder`'s (see `count`), until it closes or its admission expires."""
        earlier = self._holder.get(connection)
        if earlier is not None and earlier != holder and (holding := self.by_holder.get(earlier)) is not None:
            holding.discard(connection)
            if not holding:
                del self.by_holder[earlier]
        self.by_holder.setdefault(holder, set()).add(connection)
        self._holder[connection] = holder

    def server_gone(self, server_id: str) -> None:
        """The server shut down: its connections ended with it."""
        for connection in [connection for connection in self._held if connection.server_id == server_id]:
            self.discard(connection)

    def opened(self, connection: Connection) -> None:
        """The server reports the connection open: it counts until it closes, however long ago it was admitted."""
        self._unconfirmed.pop(connection, None)

    def claim(self, executor_id: str, connection: Connection, provider_id: str | None, key_id: str) -> None:
        """The connection acts as `executor_id` with this key (remembered before the id's owner is checked)."""
        self.by_executor.setdefault(executor_id, {})[connection] = (provider_id, key_id)
        key_sha256, _, until = self._held.get(connection, ("", None, float("inf")))
        self._held[connection] = (key_sha256, executor_id, until)

    def discard(self, connection: Connection) -> None:
        key_sha256, executor_id, _ = self._held.pop(connection, ("", None, 0.0))
        self._unconfirmed.pop(connection, None)
        holder = self._holder.pop(connection, None)
        if holder is not None and (holding := self.by_holder.get(holder)) is not None:
            holding.discard(connection)
            if not holding:
                del self.by_holder[holder]
        connections = self.by_key.get(key_sha256)
        if connections is not None:
            connections.discard(connection)
            if not connections:
                del self.by_key[key_sha256]
        if executor_id is not None and (claims := self.by_executor.get(executor_id)) is not None:
            claims.pop(connection, None)
            if not claims:
                del self.by_executor[executor_id]

    def _forget_expired(self, now: float) -> None:
        for connection in [connection for connection, (_, _, until) in self._held.items() if until < now]:
            self.discard(connection)

    def intruders(self, executor_id: str, owner: ExecutorOwner) -> set[Connection]:
        """The connections acting as `executor_id` with a key its owner does not admit (forgotten here)."""
        claims = self.by_executor.get(executor_id, {})
        found = {connection for connection, (provider_id, key_id) in claims.items()
                 if not owner.admits(provider_id, key_id)}
        for connection in found:
            self.discard(connection)
        return found


@dataclass
class Disconnector:
    """Closes the admitted connections of every key revoked while it runs, through a system account connection."""

    system: Client
    admitted: AdmittedConnections
    subscriptions: list[Subscription] = field(default_factory=list)
    kicks: set[asyncio.Task[None]] = field(default_factory=set)

    @classmethod
    async def start(cls, facts: Client, system_url: str, admitted: AdmittedConnections) -> "Disconnector":
        """Follow `key.revoked` and `executor.registered` on `facts` and disconnections on the system account, until
        `close()`."""
        # The system account has no JetStream: nothing to declare there.
        system = (await EventBus.connect(system_url, "sheshnag-authz-system", declare=False)).nc
        disconnector = cls(system, admitted)
        admitted.reconnects = lambda: int(system.stats["reconnects"])
        admitted._reconnects_seen = admitted.reconnects()
        disconnector.subscriptions = [
            await facts.subscribe(KEY_REVOKED, cb=disconnector.on_revoked),
            await facts.subscribe(EXECUTOR_REGISTERED, cb=disconnector.on_registered),
            await system.subscribe(SERVER_DISCONNECTS, cb=disconnector.on_disconnected),
            await system.subscribe(SERVER_CONNECTS, cb=disconnector.on_connected),
            await system.subscribe(SERVER_SHUTDOWNS, cb=disconnector.on_server_shutdown),
        ]
        await facts.flush()
        await system.flush()
        return disconnector

    async def on_revoked(self, message: Msg) -> None:
        try:
            fact = decode_event(message.data)
        except ValueError:
            return
        if not isinstance(fact, KeyRevoked):
            return
        for connection in self.admitted.by_key.pop(fact.key_sha256, set()):
            self._kick_later(connection)

    async def on_registered(self, message: Msg) -> None:
        """Close the connections admitted under a newly registered id with a key its owner does not admit."""
        try:
            fact = decode_event(message.data)
        except ValueError:
            return
        if not isinstance(fact, ExecutorRegistered) or fact.worker_key_id is None:
            return
        for connection in self.admitted.intruders(fact.aggregate_id,
                                                  ExecutorOwner(fact.provider_id, fact.worker_key_id)):
            log.warning("closing connection %s: it acts as executor %s with a key its owner does not admit",
                        connection, fact.aggregate_id)
            self._kick_later(connection)

    def _kick_later(self, connection: Connection) -> None:
        task = asyncio.create_task(self.kick(connection))
        self.kicks.add(task)
        task.add_done_callback(self.kicks.discard)

    async def on_disconnected(self, message: Msg) -> None:
        connection = _connection_of(message)
        if connection is not None:
            self.admitted.discard(connection)

    async def on_server_shutdown(self, message: Msg) -> None:
        parts = message.subject.split(".")
        if len(parts) == 4:  # $SYS.SERVER.<id>.SHUTDOWN, from the server itself (only it may publish there)
            self.admitted.server_gone(parts[2])

    async def on_connected(self, message: Msg) -> None:
        connection = _connection_of(message)
        if connection is not None:
            self.admitted.opened(connection)

    async def kick(self, connection: Connection) -> None:
        """Have the connection's server close it; logged, never raised (the JWT's expiry is the backstop)."""
        request = json.dumps({"cid": connection.client_id}).encode()
        problem = ""
        for attempt in range(KICK_ATTEMPTS):
            if attempt:
                await asyncio.sleep(KICK_RETRY_S)
            try:
                reply = await self.system.request(server_kick(connection.server_id), request, KICK_TIMEOUT_S)
            except (nats.errors.Error, TimeoutError) as error:
                problem = repr(error)
                continue
            answer = json.loads(reply.data or b"{}")
            if "error" not in answer:
                log.info("revoked key's connection %s closed", connection)
                return
            problem = str(answer["error"])
        log.warning("could not close revoked key's connection %s (it ends when its admission expires): %s",
                    connection, problem)

    async def close(self) -> None:
        for subscription in self.subscriptions:
            with contextlib.suppress(nats.errors.ConnectionClosedError, nats.errors.BadSubscriptionError):
                await subscription.unsubscribe()
        await asyncio.gather(*self.kicks, return_exceptions=True)
        await self.system.close()


def _connection_of(message: Msg) -> Connection | None:
    """The connection a server's connect or disconnect event is about; None for bytes that say none."""
    try:
        event = json.loads(message.data)
        return Connection(str(event["server"]["id"]), int(event["client"]["id"]))
    except (ValueError, KeyError, TypeError, OverflowError) as error:
        log.debug("unreadable connection event on %s: %r", message.subject, error)
        return None
