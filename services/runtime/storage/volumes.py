"""The free space of the volumes the stack's state lives on, held against a reserve: what the gateway refuses new
uploads and batches by, and what `sheshnag status`, the overview and the `sheshnag_storage_*` gauges show. Measured at
`SHESHNAG_STORAGE_PATHS` (statvfs, off the loop), else from the broker's JetStream account limit; with neither,
nothing is watched (a full disk is still answered 507)."""

import asyncio
import contextlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext

from services.runtime.process import metrics
from services.runtime.process.settings import ConnectionSettings

log = logging.getLogger(__name__)

BROKER_VOLUME = "broker"
FULL_BYTES = 1024 * 1024
"""Free space under which the broker's writes are taken to have failed (its log may not have room to say so)."""

VolumeLevel = Literal["ok", "warning", "refusing"]
"""`warning`: free space under twice the reserve; `refusing`: under the reserve (new uploads and batches get 507)."""
LEVEL_NUMBER: Mapping[VolumeLevel, int] = {"ok": 0, "warning": 1, "refusing": 2}
MIN_RESERVE_BYTES = 32 * 1024 * 1024
"""The least reserve a volume keeps, however small the share (but never more than a quarter of the volume)."""
ACCOUNT = "jetstream account"
"""The path a volume measured from the broker's account limits is shown with."""
CHECK_EVERY_S = 1.0


def reserve_for(total_bytes: int, percent: float, max_bytes: int) -> int:
    """The reserve of a volume of `total_bytes`: `percent` of it, at most `max_bytes`, at least the smaller of
    `MIN_RESERVE_BYTES` and a quarter of it; 0 when either setting is 0 (no reserve)."""
    if percent <= 0 or max_bytes <= 0 or total_bytes <= 0:
        return 0
    return max(min(int(total_bytes * percent / 100), max_bytes), min(MIN_RESERVE_BYTES, total_bytes // 4))


@dataclass(frozen=True)
class VolumeSpace:
    name: str
    """`broker`, `object_store`, or the name the operator gave in `SHESHNAG_STORAGE_PATHS`."""
    path: str
    total_bytes: int
    free_bytes: int
    """What an unprivileged writer may still use (statvfs `f_bavail`)."""
    reserve_bytes: int
    level: VolumeLevel

    @classmethod
    def of(cls, name: str, path: str, total_bytes: int, free_bytes: int, reserve_bytes: int) -> "VolumeSpace":
        level: VolumeLevel = ("refusing" if free_bytes < reserve_bytes
                              else "warning" if free_bytes < 2 * reserve_bytes else "ok")
        return cls(name, path, total_bytes, free_bytes, reserve_bytes, level)

    def describe(self) -> str:
        return (f"the {self.name} volume has {_mib(self.free_bytes)} free of {_mib(self.total_bytes)}, under its "
                f"reserve of {_mib(self.reserve_bytes)}")


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def space_of(path: Path, percent: float, max_bytes: int) -> tuple[int, int, int]:
    """Blocking (statvfs): the total and free bytes of `path`'s volume and the reserve kept on it; OSError when it
    cannot be measured."""
    stat = os.statvfs(path)
    total = stat.f_blocks * stat.f_frsize
    return total, stat.f_bavail * stat.f_frsize, reserve_for(total, percent, max_bytes)


def measure_paths(paths: Mapping[str, Path], percent: float, max_bytes: int) -> list[VolumeSpace]:
    """Blocking (statvfs): run it off the event loop. A path that cannot be measured is left out, with a warning."""
    volumes = []
    for name, path in paths.items():
        try:
            total, free, reserve = space_of(path, percent, max_bytes)
        except OSError as error:
            log.warning("cannot measure the %s volume at %s: %r", name, path, error)
            continue
        volumes.append(VolumeSpace.of(name, str(path), total, free, reserve))
    return volumes


async def measure_account(js: JetStreamContext, percent: float, max_bytes: int) -> list[VolumeSpace]:
    """The broker's JetStream account as a volume, when the account has a storage limit; else nothing."""
    try:
        info = await js.account_info()
    except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as error:
        log.debug("no JetStream account info: %r", error)
        return []
    limit = info.limits.max_storage or 0
    if limit <= 0:
        return []
    return [VolumeSpace.of(BROKER_VOLUME, ACCOUNT, limit, max(limit - info.storage, 0),
                           reserve_for(limit, percent, max_bytes))]


async def measure(settings: ConnectionSettings, js: JetStreamContext | None = None) -> list[VolumeSpace]:
    """Every watched volume now: the configured paths, else the broker's account (see the module's docstring)."""
    percent, max_bytes = settings.storage_reserve_percent, settings.storage_reserve_max_bytes
    if settings.storage_paths:
        return await asyncio.to_thread(measure_paths, dict(settings.storage_paths), percent, max_bytes)
    return await measure_account(js, percent, max_bytes) if js is not None else []


class StorageWatch:
    """The latest measure of the watched volumes, refreshed in the background (`run`): a request reads it, no I/O."""

    def __init__(self, settings: ConnectionSettings, js: JetStreamContext | None = None,
                 every_s: float = CHECK_EVERY_S) -> None:
        self.settings = settings
        self.js = js
        self.every_s = every_s
        self.volumes: tuple[VolumeSpace, ...] = ()

    async def refresh(self) -> tuple[VolumeSpace, ...]:
        volumes = tuple(await measure(self.settings, self.js))
        for volume in volumes:
            was = next((v.level for v in self.volumes if v.name == volume.name), "ok")
            if volume.level != was:
                log.warning("storage: %s volume is %s (%s free, reserve %s)", volume.name, volume.level,
                            _mib(volume.free_bytes), _mib(volume.reserve_bytes))
            metrics.STORAGE_FREE.labels(volume.name).set(volume.free_bytes)
            metrics.STORAGE_TOTAL.labels(volume.name).set(volume.total_bytes)
            metrics.STORAGE_RESERVE.labels(volume.name).set(volume.reserve_bytes)
            metrics.STORAGE_LEVEL.labels(volume.name).set(LEVEL_NUMBER[volume.level])
        self.volumes = volumes
        return volumes

    def short(self) -> VolumeSpace | None:
        """The first volume under its reserve, if any: new work is refused while there is one."""
        return next((volume for volume in self.volumes if volume.level == "refusing"), None)

    def broker_full(self) -> VolumeSpace | None:
        """The broker's volume once (nearly) nothing is left on it: no write of any kind is taken then (on a full
        disk a publish is not even answered, only timed out), so none is tried."""
        return next((volume for volume in self.volumes
                     if volume.name == BROKER_VOLUME and volume.free_bytes < FULL_BYTES), None)

    async def run(self) -> None:
        """Refresh every `every_s` until cancelled."""
        while True:
            with contextlib.suppress(OSError):
                await self.refresh()
            await asyncio.sleep(self.every_s)
