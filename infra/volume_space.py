"""What the watches of `sheshnag up` share (infra/broker_watch.py, infra/object_store_watch.py): a volume's free space
against its reserve, the server they restart, and how often they may."""

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from services.runtime.storage.volumes import space_of as volume_space

RESTART_BACKOFF_S = 30.0
"""The least time between two restarts of one watch's; doubled for each further one within `BACKOFF_MEMORY_S`."""
BACKOFF_MEMORY_S = 600.0


class Restartable(Protocol):
    """A supervised server process (infra/supervisor.py's `Supervised`)."""

    name: str
    restarts: int

    def stop(self, within_s: float = ...) -> None:
        """SIGTERM, then SIGKILL after `within_s`."""

    def start(self) -> None: ...


def space_of(path: Path, reserve_percent: float, reserve_max_bytes: int) -> tuple[int | None, int]:
    """Free bytes on `path`'s volume (None: not to be read) and the reserve kept on it."""
    try:
        _, free, reserve = volume_space(path, reserve_percent, reserve_max_bytes)
    except OSError:
        return None, 0
    return free, reserve


@dataclass
class RestartBackoff:
    restarts: list[float] = field(default_factory=list)
    """When (monotonic) each restart within `BACKOFF_MEMORY_S` was done."""

    def note(self) -> None:
        now = time.monotonic()
        self.restarts = [at for at in self.restarts if now - at < BACKOFF_MEMORY_S] + [now]  # a stack runs for years

    def waiting(self) -> bool:
        """Whether the last restart is too recent for another one."""
        now = time.monotonic()
        recent = [at for at in self.restarts if now - at < BACKOFF_MEMORY_S]
        return bool(recent) and now - recent[-1] < RESTART_BACKOFF_S * 2 ** min(len(recent) - 1, 4)
