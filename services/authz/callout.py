"""The auth callout: nats-server asks who each connecting client is; a live worker key makes it an executor.

The client connects with its executor id as user and its worker key as password. The answer is a user JWT,
signed by the issuer nkey the server trusts, that grants `executor_permissions(executor_id)` and expires after
`ttl_s` (the connection then re-authorizes, so a revoked key is shut out within that time). Anything else is
refused with a reason the server logs.
"""

import logging
import re
import time
from dataclasses import dataclass

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from contracts.ids import hash_api_key
from contracts.permissions import AUTH_CALLOUT_SUBJECT, EXECUTOR_ID_PATTERN, executor_permissions
from services.authz import nkey_jwt
from services.runtime.bus import EventBus
from services.runtime.fleet import Fleet
from services.runtime.readmodel import ReadModel
from services.runtime.settings import ConnectionSettings
from services.scheduler.registration import worker_key_refusal

log = logging.getLogger(__name__)

GLOBAL_ACCOUNT = "$G"
"""The account of a server configured without accounts: executors are placed in it, beside the services."""
RESPONDERS = "sheshnag-authz"
"""Queue group: with several schedulers, one of them answers each connection."""
NO_LIMIT = -1


class Refused(Exception):
    """The connection may not join: the reason goes back to the server (and its log), never to the client."""


@dataclass
class ExecutorAuthority:
    read_model: ReadModel
    issuer_seed: str
    ttl_s: float = 3600.0

    async def admit(self, user: str, password: str) -> str:
        """The executor id a connection may act as, or Refused."""
        if not re.fullmatch(EXECUTOR_ID_PATTERN, user):
            raise Refused(f"user {user[:80]!r} is not an executor id")
        record = await self.read_model.get_api_key(hash_api_key(password))
        refusal = worker_key_refusal(record)
        if refusal is not None or record is None:
            raise Refused(f"executor {user}: {refusal}")
        executor = await self.read_model.get_executor(user)
        if executor is not None and executor.status == "online" and executor.worker_key_id not in (None,
                                                                                                  record.key_id):
            raise Refused(f"executor {user} is online under another worker key")
        return user

    def user_jwt(self, user_nkey: str, executor_id: str) -> str:
        permissions = executor_permissions(executor_id)
        return nkey_jwt.encode({
            "sub": user_nkey, "aud": GLOBAL_ACCOUNT, "name": executor_id, "exp": int(time.time() + self.ttl_s),
            "nats": {"pub": {"allow": list(permissions.publish)}, "sub": {"allow": list(permissions.subscribe)},
                     "subs": NO_LIMIT, "data": NO_LIMIT, "payload": NO_LIMIT, "type": "user", "version": 2},
        }, self.issuer_seed)

    async def answer(self, request_jwt: str) -> str:
        """The signed authorization response to one request of the server's."""
        request = nkey_jwt.decode(request_jwt).get("nats", {})
        user_nkey, server_id = request.get("user_nkey", ""), request.get("server_id", {}).get("id", "")
        if not user_nkey or not server_id:
            raise nkey_jwt.MalformedJwt("an authorization request names the user nkey and the server")
        options = request.get("connect_opts", {})
        response: dict[str, object] = {"type": "authorization_response", "version": 2}
        try:
            executor_id = await self.admit(str(options.get("user", "")), str(options.get("pass", "")))
        except Refused as refusal:
            log.warning("NATS connection refused: %s", refusal)
            response["error"] = str(refusal)
        else:
            log.info("executor %s admitted to NATS", executor_id)
            response["jwt"] = self.user_jwt(user_nkey, executor_id)
        return nkey_jwt.encode({"sub": user_nkey, "aud": server_id, "nats": response}, self.issuer_seed)

    async def on_request(self, message: Msg) -> None:
        try:
            answer = await self.answer(message.data.decode())
        except (nkey_jwt.MalformedJwt, UnicodeDecodeError, AttributeError) as error:
            # Unanswered, the server refuses the connection when its auth timeout passes.
            log.error("unreadable auth callout request on %s: %r", message.subject, error)
            return
        await message.respond(answer.encode())

    async def serve(self, bus: EventBus) -> Subscription:
        return await bus.nc.subscribe(AUTH_CALLOUT_SUBJECT, queue=RESPONDERS, cb=self.on_request)


async def admit_executors(bus: EventBus, settings: ConnectionSettings) -> Subscription | None:
    """Answer the broker's auth callout on this connection until it closes; None without the issuer seed."""
    if not settings.nats_callout_seed:
        return None
    authority = ExecutorAuthority(await ReadModel.open(bus), settings.nats_callout_seed, settings.nats_executor_ttl_s)
    await Fleet.open(bus)  # executors may heartbeat into the bucket but not declare it
    return await authority.serve(bus)
