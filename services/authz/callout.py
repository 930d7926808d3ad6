"""The auth callout: nats-server asks who each connecting client is (executor id as user, worker key as password); a
live worker key gets a user JWT granting `executor_permissions(executor_id)` until `ttl_s`, and has its connections
closed once revoked (`disconnect.py`). Refusals carry a reason the server logs."""

import logging
import re
import time
from dataclasses import dataclass, field

import nats.errors
from nats.aio.msg import Msg

from contracts.events.executor import ExecutorRegistered
from contracts.ids import hash_api_key
from contracts.permissions import (
    AUTH_CALLOUT_SUBJECT,
    EXECUTOR_ID_PATTERN,
    EXECUTOR_MAX_PAYLOAD,
    executor_permissions,
)
from contracts.readmodel import ApiKeyRecord
from contracts.subjects import event_subject
from services.authz import nkey_jwt
from services.authz.disconnect import AdmittedConnections, Connection, Disconnector
from services.authz.keyring import CalloutKeys
from services.authz.request import AuthRequest, ForgedRequest, opened
from services.runtime.nats.answers import RawAnswer
from services.runtime.nats.bus import EventBus
from services.runtime.nats.facts import next_fact
from services.runtime.nats.fleet import Fleet
from services.runtime.nats.readmodel import ReadModel
from services.runtime.nats.revocations import revoked
from services.runtime.process.settings import ConnectionSettings
from services.runtime.process.skip_log import SkipLog
from services.scheduler.book import ExecutorOwner
from services.scheduler.registration import worker_key_refusal

log = logging.getLogger(__name__)

GLOBAL_ACCOUNT = "$G"
"""The account of a server configured without accounts: executors are placed in it, beside the services."""
RESPONDERS = "sheshnag-authz"
"""Queue group: with several schedulers, one of them answers each connection."""
CALLOUT = RawAnswer(AUTH_CALLOUT_SUBJECT, RESPONDERS)
"""Answered by a scheduler's router, leader or standby: requests are sealed JWTs with no contract to decode, answers
sealed bytes; a forged request goes unanswered."""
NO_LIMIT = -1
ADMISSION_MARGIN_S = 60.0
"""How long past its admission's expiry a connection is still remembered (the server ends it at the expiry)."""


class Refused(Exception):
    """The connection may not join: the reason goes back to the server (and its log), never to the client."""


@dataclass
class ExecutorAuthority:
    bus: EventBus
    read_model: ReadModel
    keys: CalloutKeys
    ttl_s: float = 3600.0
    max_connections: int = 1024
    """Connections one provider's worker keys (or one key of no provider) may hold at once, as this scheduler counts
    those it admitted."""
    admitted: AdmittedConnections = field(default_factory=AdmittedConnections)
    refusals: SkipLog = field(default_factory=lambda: SkipLog(log, "NATS connection refused"))
    """A line a minute at most, however many connections a flood of bad keys makes."""

    async def admit(self, user: str, password: str, connection: Connection) -> str:
        """The executor id a connection may act as (unregistered, or registered to this key's owner), or Refused.
        `connection` is remembered as acting under that id before its owner is read, so a registration of the id by
        another provider stored meanwhile closes it."""
        if not re.fullmatch(EXECUTOR_ID_PATTERN, user):
            raise Refused(f"user {user[:80]!r} is not an executor id")
        key_sha256 = hash_api_key(password)
        record = await self.read_model.get_api_key(key_sha256)
        refusal = worker_key_refusal(record)
        if refusal is not None or record is None:
            raise Refused(f"executor {user}: {refusal}")
        # The read model may lag a revoke the log already holds.
        if await revoked(self.bus, key_sha256, record.key_id):
            raise Refused(f"executor {user}: Worker key {record.key_id} was revoked.")
        holder = record.provider_id or record.key_id
        if self.admitted.count(holder) >= self.max_connections:  # counted and held with no wait between
            raise Refused(f"executor {user}: {'provider ' + holder if record.provider_id else 'worker key ' + holder}"
                          f" already holds {self.max_connections} connections, the most allowed")
        self.admitted.hold(holder, connection)
        self.admitted.claim(user, connection, record.provider_id, record.key_id)
        await self._check_owner(user, record)
        executor = await self.read_model.get_executor(user)
        if executor is not None and executor.status == "online" and executor.worker_key_id not in (None, record.key_id):
            raise Refused(f"executor {user} is online under another worker key")
        return user

    async def _check_owner(self, executor_id: str, record: ApiKeyRecord) -> None:
        """An executor id is admitted only for the provider (or operator key) that first registered it: read from
        the log itself, not the read model, so no lag lets another provider's key in under it."""
        first = await first_keyed_registration(self.bus, executor_id)
        if first is None:
            return  # never registered: registration claims it, one at a time, on the leader's book
        owner = ExecutorOwner(first.provider_id, first.worker_key_id or "")
        if not owner.admits(record.provider_id, record.key_id):
            raise Refused(f"executor id {executor_id} belongs to another provider")

    def user_jwt(self, user_nkey: str, executor_id: str) -> str:
        permissions = executor_permissions(executor_id)
        return nkey_jwt.encode({
            "sub": user_nkey, "aud": GLOBAL_ACCOUNT, "name": executor_id, "exp": int(time.time() + self.ttl_s),
            "nats": {"pub": {"allow": list(permissions.publish)}, "sub": {"allow": list(permissions.subscribe)},
                     "subs": NO_LIMIT, "data": NO_LIMIT, "payload": EXECUTOR_MAX_PAYLOAD, "type": "user", "version": 2},
        }, self.keys.issuer_seed)

    async def answer(self, request: AuthRequest) -> bytes:
        """The sealed, signed authorization response to one (verified) request of the server's."""
        response: dict[str, object] = {"type": "authorization_response", "version": 2}
        connection = Connection(request.server_id, request.client_id)
        key_sha256 = hash_api_key(request.password)
        # Remembered before the checks: a revoke stored while they run still finds the connection to close.
        self.admitted.add(key_sha256, connection, self.ttl_s + ADMISSION_MARGIN_S)
        try:
            executor_id = await self.admit(request.user, request.password, connection)
        except Refused as refusal:
            self.admitted.discard(connection)
            self.refusals.skipped("executor connections", str(refusal))
            response["error"] = str(refusal)
        else:
            log.info("executor %s admitted to NATS", executor_id)
            response["jwt"] = self.user_jwt(request.user_nkey, executor_id)
        token = nkey_jwt.encode({"sub": request.user_nkey, "aud": request.server_id, "nats": response},
                                self.keys.issuer_seed)
        return self.keys.curve.seal(token.encode(), request.server_xkey)

    async def on_request(self, message: Msg) -> None:
        try:
            request = opened(message.data, message.headers, self.keys)
        except ForgedRequest as forged:
            # Unanswered: a real server refuses the connection when its auth timeout passes.
            log.error("auth callout request on %s not answered: %s", message.subject, forged)
            return
        try:
            answer = await self.answer(request)
        except (nats.errors.Error, TimeoutError) as error:
            # The key could not be checked (broker unreachable): unanswered, so the connection is refused.
            self.admitted.discard(Connection(request.server_id, request.client_id))
            log.error("auth callout for %r not answered: %r", request.user[:80], error)
            return
        except BaseException:  # unanswered: the connection is refused, and not remembered
            self.admitted.discard(Connection(request.server_id, request.client_id))
            raise
        await message.respond(answer)


FIRST_REGISTRATIONS_READ = 16
"""Registrations without a worker key (from before keys) skipped at most, looking for an id's first keyed one."""


async def first_keyed_registration(bus: EventBus, executor_id: str) -> ExecutorRegistered | None:
    """The id's first registration with a worker key (its owner's), as the scheduler's book takes it."""
    subject, after = event_subject("executor", executor_id, ExecutorRegistered.name), 0
    for _ in range(FIRST_REGISTRATIONS_READ):
        found = await next_fact(bus, subject, after + 1)
        if found is None:
            return None
        after, fact = found
        if isinstance(fact, ExecutorRegistered) and fact.worker_key_id is not None:
            return fact
    return None


@dataclass
class Admissions:
    """The callout's authority and its disconnector, until `close()`."""

    authority: ExecutorAuthority
    disconnector: Disconnector

    async def close(self) -> None:
        await self.disconnector.close()


async def open_admissions(bus: EventBus, settings: ConnectionSettings) -> Admissions | None:
    """The callout's authority on `bus`'s connection and its disconnector, until closed; None without a seed."""
    if not settings.nats_callout_seed:
        return None
    keys = CalloutKeys(settings.nats_callout_seed)
    authority = ExecutorAuthority(bus, await ReadModel.open(bus), keys, settings.nats_executor_ttl_s,
                                  settings.nats_max_connections_per_provider)
    await Fleet.open(bus)  # executors' adverts are written into it (through a scheduler), never declared by them
    return Admissions(authority, await Disconnector.start(bus.nc, keys.system_url(settings.nats_url),
                                                          authority.admitted))
