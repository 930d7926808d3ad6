"""The NATS client every service connects with: nats-py's, except that expired credentials mean reconnect.

When a connection's admission expires (an executor's user JWT from the auth callout, `SHESHNAG_NATS_EXECUTOR_TTL_S`)
the server sends `-ERR 'User Authentication Expired'` and hangs up. nats-py closes the connection for good on
that error (nats-io/nats.py#1019), so the executor's consumers ended and the process died. Reconnecting, as the Go
client does, asks the callout again: a live worker key is admitted afresh, a revoked one is refused (and the
client keeps retrying, shut out).
"""

import nats.errors
from nats.aio.client import Client

AUTHENTICATION_EXPIRED = "authentication expired"
"""In the server's error line, lowercased by nats-py's parser."""


class ReadmittingClient(Client):
    async def _process_err(self, err_msg: str) -> None:
        if AUTHENTICATION_EXPIRED not in err_msg or not self.options["allow_reconnect"]:
            await super()._process_err(err_msg)
            return
        error = nats.errors.Error(f"nats: {err_msg.strip(chr(39))}")
        await self._error_cb(error)
        await self._process_op_err(error)
