"""Bringing the stack's own object store back to writing after its disk filled, without a hand restart.

Measured with SeaweedFS 4.48 (`weed mini`) on a full tmpfs: its volume server marks the disk's volumes unwritable
("Volume 1 becomes unwritable"), and every write is answered 500 "No writable volumes and no free volumes left ...
Not enough data nodes found!" until it looks at the disk again; once space returned that took 40 s on a quiet machine
and over two minutes on a loaded one. A restart clears it at once. So once the store's volume has been under its
reserve, this watch writes a probe (an object as large as a result chunk into a directory of each of the filer's
partitions) every few seconds after space is back; if the store still answers with a refusal `STUCK_AFTER_S` after
space returned, it is restarted on the same port and data.
A store that does not answer at all is the supervisor's (it restarts a dead process); the watch never restarts one
that writes. Nothing is lost: a write the store refused was answered as failed to its writer, who retries it.
"""

import asyncio
import hashlib
import io
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import urllib3
from minio import Minio
from minio.error import MinioException

from infra.volume_space import Restartable, RestartBackoff, space_of

log = logging.getLogger("sheshnag.up")

PROBE_EVERY_S = 2.0
STUCK_AFTER_S = 15.0
"""How long the store may go on refusing writes after its volume is back above its reserve before it is restarted."""
PROBE_PREFIX = "health/object-store-probes"
"""Outside `files/` (what the orphan sweep and quotas read): the probe's objects, each rewritten by each probe."""
FILER_PARTITIONS = 8
"""SeaweedFS's filer keeps its entries in 8 LevelDB stores, a directory's in the one the last byte of its path's MD5
names, modulo 8 (`weed/filer/leveldb2`). A store whose write met the full disk went on refusing every write to its
directories after space returned while the others wrote (a CI run: result chunks refused 100 s after a one-object probe
was taken), so the probe writes an object into a directory of each."""
PROBE_BYTES = 64 * 1024
"""As large as a result chunk: SeaweedFS takes an object of a few bytes without a writable volume (a CI run saw a
2-byte probe and small uploads taken while every 32 KiB chunk was refused "No writable volumes" for minutes)."""
PROBE_TIMEOUT_S = 5.0
STOP_WITHIN_S = 3.0
"""SeaweedFS stops in about 2 s, but after a full disk its filer hung for the whole 10 s grace: it is killed sooner
(what it wrote before is in the kernel's hands)."""

Probe = Literal["written", "refused", "unreachable"]


def probe_keys(bucket: str) -> list[str]:
    """One object key in a directory of each of the filer's partitions (`FILER_PARTITIONS`)."""
    chosen: dict[int, str] = {}
    number = 0
    while len(chosen) < FILER_PARTITIONS:
        directory = f"{PROBE_PREFIX}/{number}"
        digest = hashlib.md5(f"/buckets/{bucket}/{directory}".encode(), usedforsecurity=False).digest()
        chosen.setdefault(digest[-1] % FILER_PARTITIONS, f"{directory}/probe")
        number += 1
    return [chosen[partition] for partition in sorted(chosen)]


def probe_client(endpoint: str, access_key: str, secret_key: str, secure: bool = False) -> Minio:
    """A client that asks once and says what it was answered: no retries, short timeouts."""
    http = urllib3.PoolManager(num_pools=1, maxsize=1, retries=False,
                               timeout=urllib3.Timeout(connect=PROBE_TIMEOUT_S, read=PROBE_TIMEOUT_S))
    return Minio(endpoint, access_key=access_key, secret_key=secret_key, secure=secure, http_client=http)


@dataclass
class ObjectStoreWatch:
    store: Path
    """The object store's data folder (its volume is the one watched)."""
    client: Minio | None
    """Writes the probe; None: the store is never probed (nor restarted)."""
    bucket: str
    reserve_percent: float = 5.0
    reserve_max_bytes: int = 1 << 30
    was_short: bool = False
    """Whether the volume has been under its reserve since the store last took a probe."""
    back_at: float | None = None
    """When (monotonic) space was seen back above the reserve, after it was short; None while short or writing."""
    probed_at: float = 0.0
    backoff: RestartBackoff = field(default_factory=RestartBackoff)
    _pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="s3-watch"))

    async def check(self, s3: Restartable, wait_ready: Callable[[], None]) -> None:
        """Note a volume under its reserve; once space is back, probe, and restart a store stuck refusing writes."""
        free, reserve = await asyncio.to_thread(space_of, self.store, self.reserve_percent, self.reserve_max_bytes)
        if free is None:
            return
        now = time.monotonic()
        if free < reserve:
            if not self.was_short:
                log.warning("the object store's volume is under its reserve (%.1f MiB free): its writes are "
                            "probed once space returns", free / 2**20)
            self.was_short, self.back_at = True, None
            return
        if not self.was_short or now - self.probed_at < PROBE_EVERY_S:
            return
        self.back_at = self.back_at or now
        self.probed_at = now
        answer = await self._probe()
        if answer == "written":
            log.info("the object store writes again, %.1fs after its volume had room", now - self.back_at)
            self.was_short, self.back_at = False, None
            return
        if answer == "unreachable" or now - self.back_at < STUCK_AFTER_S or self.backoff.waiting():
            return
        log.warning("restarting %s: it still refuses writes %.1fs after its volume had room again (%.1f MiB free)",
                    s3.name, now - self.back_at, free / 2**20)
        self.backoff.note()
        self.back_at = time.monotonic()  # the restarted store gets its own time to write again
        await asyncio.to_thread(s3.stop, STOP_WITHIN_S)
        await asyncio.to_thread(s3.start)  # a start builds its command and files: off the loop
        s3.restarts += 1
        await asyncio.to_thread(wait_ready)

    async def _probe(self) -> Probe:
        if self.client is None:
            return "unreachable"
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._write_probe)

    def _write_probe(self) -> Probe:
        assert self.client is not None
        try:
            for key in probe_keys(self.bucket):
                self.client.put_object(self.bucket, key, io.BytesIO(bytes(PROBE_BYTES)), PROBE_BYTES)
        except MinioException as error:  # answered: S3's error, or an answer that is not S3's (a bare 5xx)
            log.info("the object store refused the probe: %s", str(error)[:300])
            return "refused"
        except (urllib3.exceptions.HTTPError, OSError, ValueError):
            return "unreachable"
        return "written"

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
