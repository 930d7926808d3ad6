"""faststream's `Context()` and `Path()` handler parameters, resolved on the event loop: fast_depends runs a plain
(non-coroutine) resolver in a worker thread, as faststream's are, costing every message a thread hop (the GIL handed
over twice, a task group opened) for a dictionary read. Every handler declares its parameters with these."""

from collections.abc import Callable
from typing import Any

from faststream._internal.constants import EMPTY
from faststream._internal.context import Context as _FaststreamContext


class _ResolvedInPlace(_FaststreamContext):
    # fast_depends awaits a coroutine resolver (`run_async`) where it hands a plain one to a worker thread.
    async def use(self, /, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        return super().use(**kwargs)


def Context(real_name: str = "", *, cast: bool = False, default: Any = EMPTY,
            initial: Callable[..., Any] | None = None) -> Any:
    """A value of the broker's context (e.g. the service's dependencies), as faststream's `Context()`."""
    return _ResolvedInPlace(real_name=real_name, cast=cast, default=default, initial=initial)


def Path(real_name: str = "", *, cast: bool = True, default: Any = EMPTY) -> Any:
    """A `{name}` of the subscribed subject, as faststream's `Path()`."""
    return _ResolvedInPlace(real_name=real_name, cast=cast, default=default, prefix="message.path.")
