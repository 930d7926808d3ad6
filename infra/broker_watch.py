"""Bringing the stack's own broker back after its disk filled, without a hand restart.

Measured with nats-server 2.15 on a full tmpfs: a publish whose write fails gets no answer, and the stream stays
stuck on the error (every later publish times out) even once space returns; on other write errors JetStream disables
itself ("jetstream not enabled"). Only a restart of nats-server clears either. The supervisor asks this watch every
tick: a fault is noted when the broker's volume runs (nearly) out of space, when the broker's log says a write failed
for space, or when `$JS.API.INFO` answers that JetStream is not enabled; once the volume is back above its reserve,
the broker is restarted on the same port and data. Nothing is lost: every write the broker did not acknowledge was
answered as failed to its writer, who retries it, and what it acknowledged is on disk.
"""

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import nats
import nats.errors
import orjson
from nats.aio.client import Client

from infra.volume_space import Restartable, RestartBackoff, space_of
from services.runtime.storage.volumes import FULL_BYTES

log = logging.getLogger("sheshnag.up")

FAULT_WORDS = (b"no space left on device", b"critical write error", b"disabling jetstream",
               b"jetstream out of resources")
SPACE_WORDS = ("no space left on device", "out of resources")
"""Fault lines that say the disk was full: evidence enough that a restart once space returns is the cure."""
PROBE_EVERY_S = 2.0
PROBE_TIMEOUT_S = 1.0
LOG_READ_BYTES = 1 << 20
JETSTREAM_OFF = "jetstream not enabled"


@dataclass
class BrokerWatch:
    store: Path
    """The broker's data folder (its volume is the one watched)."""
    log_file: Path
    url: str | None
    """The broker's URL with the core user's credentials, for the `$JS.API.INFO` probe; None: not probed."""
    reserve_percent: float = 5.0
    reserve_max_bytes: int = 1 << 30
    fault: str | None = None
    """Why the broker is due a restart once space returns; None while it writes."""
    fault_at: float = 0.0
    space_short: bool = False
    """Whether the fault came with evidence of a full disk (free space under the reserve, or the log saying so):
    only then does a restart cure it; a broker that stops writing for another reason (a failing disk) is the
    operator's, and restarting it again and again would make the outage worse."""
    log_offset: int = field(default=-1)
    probed_at: float = 0.0
    backoff: RestartBackoff = field(default_factory=RestartBackoff)
    _nc: Client | None = None

    async def check(self, broker: Restartable, wait_ready: Callable[[], None]) -> None:
        """Note a fault, and restart the broker once its volume has room again."""
        free, reserve = await asyncio.to_thread(self._space)
        if free is not None and free < reserve:
            self.space_short = True
        if free is not None and free < FULL_BYTES:
            self._note(f"its volume has {free} bytes free")
        for why in await asyncio.to_thread(self._log_faults):
            self._note(f"its log says {why!r}")
            self.space_short = self.space_short or any(words in why.lower() for words in SPACE_WORDS)
        if self.url is not None and time.monotonic() - self.probed_at >= PROBE_EVERY_S:
            self.probed_at = time.monotonic()
            if await self._jetstream_off():
                self._note("JetStream is not enabled")
        if self.fault is None or not self.space_short or free is None or free < reserve or self.backoff.waiting():
            return
        log.warning("restarting %s: %s (%.1fs ago); its volume has %.1f MiB free again", broker.name, self.fault,
                    time.monotonic() - self.fault_at, free / 2**20)
        # Cleared first: a broker slow to come back (rebuilding its indexes) is waited for, never restarted again
        # by this fault; the supervisor restarts one that dies, with its own backoff.
        self.fault, self.space_short, self.log_offset = None, False, -1
        self.backoff.note()
        await self.close()
        await asyncio.to_thread(broker.stop)
        await asyncio.to_thread(broker.start)  # a start builds its command and files: off the loop
        broker.restarts += 1
        await asyncio.to_thread(wait_ready)

    def _note(self, why: str) -> None:
        if self.fault is None:
            log.error("the broker stopped writing: %s; it is restarted once its volume is above its reserve", why)
            self.fault, self.fault_at = why, time.monotonic()

    def _space(self) -> tuple[int | None, int]:
        return space_of(self.store, self.reserve_percent, self.reserve_max_bytes)

    def _log_faults(self) -> list[str]:
        """Fault lines the broker logged since the last look (from the end, at the first look)."""
        try:
            size = self.log_file.stat().st_size
            if self.log_offset < 0 or size < self.log_offset:
                self.log_offset = size
                return []
            with self.log_file.open("rb") as log_file:
                log_file.seek(max(self.log_offset, size - LOG_READ_BYTES))
                text = log_file.read(size - self.log_offset)
        except OSError:
            return []
        self.log_offset = size
        return [line.decode(errors="replace")[-200:] for line in text.splitlines()
                if any(words in line.lower() for words in FAULT_WORDS)]

    async def _jetstream_off(self) -> bool:
        if self.url is None:
            return False
        try:
            if self._nc is None or not self._nc.is_connected:
                await self.close()
                self._nc = await nats.connect(self.url, name="sheshnag-up-watch", connect_timeout=PROBE_TIMEOUT_S,
                                              max_reconnect_attempts=0, allow_reconnect=False,
                                              error_cb=_connection_lost)
            reply = await self._nc.request("$JS.API.INFO", b"", timeout=PROBE_TIMEOUT_S)
        except nats.errors.NoRespondersError:
            return True  # nothing answers the JetStream API: it is off
        except (nats.errors.Error, OSError, TimeoutError):
            return False  # down or slow: the supervisor restarts a dead broker anyway
        with contextlib.suppress(orjson.JSONDecodeError, AttributeError):
            error = orjson.loads(reply.data).get("error") or {}
            return JETSTREAM_OFF in str(error.get("description", "")).lower()
        return False

    async def close(self) -> None:
        if self._nc is not None:
            with contextlib.suppress(nats.errors.Error, OSError):
                await self._nc.close()
            self._nc = None


async def _connection_lost(error: Exception) -> None:
    """The probe's connection broke (the broker restarting): said in a line, not as nats-py's traceback; the next
    probe connects again."""
    log.info("the broker watch's connection: %r", error)


def jetstream_limits(store: Path) -> str:
    """The broker's config block that sizes its file store by its volume, not by 75 % of what is free when it starts
    (its default): restarted on a fuller disk, JetStream would otherwise refuse every write as over its limit. The
    free-space reserve (services/runtime/storage/volumes.py) is what keeps the disk from filling."""
    try:
        stat = os.statvfs(store)
    except OSError:
        return ""
    return f"jetstream {{ max_file_store: {stat.f_blocks * stat.f_frsize} }}\n"
