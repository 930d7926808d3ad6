"""Keeping a copy of some of a bucket's keys in memory: a watch that shows every current value, says when it has,
then each change; a broken watch is made again (after a pause) and shows everything again. What a keeper holds is
rebuilt from each watch's current values, so a value changed or erased while no watch ran is never kept stale."""

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Protocol, TypeVar

import nats.errors
import nats.js.errors
import pydantic
from nats.js.kv import KeyValue

log = logging.getLogger(__name__)

RESUME_AFTER_S = 1.0
"""The pause before a broken or ended watch is made again."""
WATCH_INACTIVE_S = 60.0
"""How long the broker keeps a watch's consumer once nobody listens (a process killed leaves it behind; nats-py's
default would keep it 5 minutes, so a service restarting in a loop would pile them up)."""
Model = TypeVar("Model", bound=pydantic.BaseModel)


class Keeper(Protocol):
    def restart(self) -> None:
        """A new watch begins: what it shows from now on is everything there is."""

    def put(self, key: str, value: bytes | None, revision: int) -> None:
        """A key's value as the watch shows it (None or empty: deleted), at the stream sequence `revision`."""

    def current(self) -> None:
        """Every current value has been shown."""

    def lost(self) -> None:
        """The watch ended or broke: what is held may be stale until the next `current`."""


async def keep(kv: KeyValue, keys: str, keeper: Keeper, what: str,
               ended: Callable[[], bool] = lambda: False) -> None:
    """Show `keeper` the keys matching `keys` as the bucket changes, until cancelled; a watch also ends (to be made
    again) once `ended` says so after a change."""
    while True:
        try:
            watcher = await kv.watch(keys, inactive_threshold=WATCH_INACTIVE_S)
            keeper.restart()
            try:
                async for entry in watcher:
                    if entry is None:  # the end of the current values
                        keeper.current()
                    else:
                        keeper.put(entry.key, entry.value, entry.revision or 0)
                    if ended():
                        break
            finally:
                keeper.lost()
                with contextlib.suppress(nats.errors.Error, nats.js.errors.Error):
                    await watcher.stop()
            if ended():
                continue  # made again at once
        except (nats.errors.Error, nats.js.errors.Error) as error:
            log.warning("the watch of %s was interrupted, resuming: %r", what, error)
        await asyncio.sleep(RESUME_AFTER_S)


def decoded(model: type[Model], key: str, value: bytes | None, what: str) -> Model | None:
    """The value as `model`; None when deleted, or (logged) when it does not decode as one."""
    if not value:
        return None
    try:
        return model.model_validate_json(value)
    except pydantic.ValidationError:
        log.warning("%s at %s does not decode; it is left out", what, key)
        return None
