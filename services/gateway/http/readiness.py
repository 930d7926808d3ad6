"""`GET /readyz`: whether this gateway can serve, i.e. reaches the broker and the object store now (each asked
cheaply, with a short timeout); `/healthz` is liveness and asks nothing. A probe is logged when its answer
changes, not every time it is asked."""

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

import nats.errors
import urllib3
from aiohttp import web
from minio import Minio
from minio.error import S3Error

from services.gateway.context import deps
from services.runtime.nats.bus import EventBus
from services.runtime.process.settings import ConnectionSettings
from services.runtime.storage.objectstore import https_pool

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 2.0
"""How long each of the broker and the object store may take to answer a readiness probe."""
Check = Literal["ok", "disconnected", "timeout", "error", "bucket missing"]


@dataclass
class Readiness:
    """The object store is asked with its own client (one try, short timeouts) in its own thread, one probe at a
    time: a dead S3 ties up neither the store's pool nor more than one thread, however often it is probed."""

    s3: Minio
    bucket: str
    pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="readyz"))
    _s3_probe: "asyncio.Future[bool] | None" = None
    _last: dict[str, Check] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, settings: ConnectionSettings) -> "Readiness":
        http = https_pool(settings.s3_tls_ca, num_pools=1, maxsize=1, retries=False,
                          timeout=urllib3.Timeout(connect=PROBE_TIMEOUT_S, read=PROBE_TIMEOUT_S))
        client = Minio(settings.s3_endpoint, access_key=settings.s3_access_key, secret_key=settings.s3_secret_key,
                       secure=settings.s3_secure, http_client=http)
        return cls(client, settings.s3_bucket)

    async def broker(self, bus: EventBus) -> Check:
        if not bus.nc.is_connected:
            return "disconnected"
        try:
            await asyncio.wait_for(bus.js.account_info(), PROBE_TIMEOUT_S)
        except TimeoutError:
            return "timeout"
        except (nats.errors.Error, OSError) as error:
            return self._failed("nats", error)
        return "ok"

    async def object_store(self) -> Check:
        if self._s3_probe is None or self._s3_probe.done():
            self._s3_probe = asyncio.get_running_loop().run_in_executor(self.pool, self.s3.bucket_exists, self.bucket)
        try:
            exists = await asyncio.wait_for(asyncio.shield(self._s3_probe), PROBE_TIMEOUT_S)
        except TimeoutError:
            return "timeout"
        except (S3Error, urllib3.exceptions.HTTPError, OSError) as error:
            return self._failed("s3", error)
        return "ok" if exists else "bucket missing"

    def _failed(self, what: str, error: Exception) -> Check:
        if self._last.get(what) != "error":
            log.warning("readiness: %s does not answer: %r", what, error)
        return "error"

    def said(self, checks: dict[str, Check]) -> None:
        for what, check in checks.items():
            if self._last.get(what, "ok") != check:
                log.log(logging.INFO if check == "ok" else logging.WARNING, "readiness: %s %s", what, check)
        self._last = dict(checks)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


READINESS = web.AppKey("readiness", Readiness)


async def readyz(request: web.Request) -> web.Response:
    readiness = request.app[READINESS]
    nats, s3 = await asyncio.gather(readiness.broker(deps(request).bus), readiness.object_store())
    checks = {"nats": nats, "s3": s3}
    readiness.said(checks)
    ready = all(check == "ok" for check in checks.values())
    return web.json_response({"status": "ready" if ready else "unavailable", "checks": checks},
                             status=200 if ready else 503)
