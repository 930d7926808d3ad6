"""Handler parameters taken from the broker's context or the subject resolve on the event loop's own thread (no
worker-thread hop per message), with the same values faststream's own `Context()` and `Path()` give."""

import asyncio
import threading
from typing import Annotated, Any

import fast_depends.utils
import pytest
from faststream.nats import NatsBroker, TestNatsBroker

from services.runtime.process.params import Context, Path


async def test_context_and_path_parameters_resolve_in_place_with_faststream_s_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hops: list[object] = []
    to_thread = fast_depends.utils.run_in_threadpool

    async def counted(func: Any, *args: Any, **kwargs: Any) -> Any:
        hops.append(func)
        return await to_thread(func, *args, **kwargs)

    monkeypatch.setattr(fast_depends.utils, "run_in_threadpool", counted)
    broker = NatsBroker()
    broker.context.set_global("dependencies", {"name": "the service's"})
    seen: dict[str, object] = {}
    loop_thread = threading.get_ident()
    resolving_threads: set[int] = set()
    handled = asyncio.Event()

    @broker.subscriber("svc.asks.{executor_id}")
    async def answer(body: dict[str, str], executor_id: Annotated[str, Path()],
                     dependencies: Annotated[dict[str, str], Context()]) -> None:
        seen.update(body=body, executor_id=executor_id, dependencies=dependencies)
        resolving_threads.add(threading.get_ident())
        handled.set()

    async with TestNatsBroker(broker) as test_broker:
        await test_broker.publish({"ask": "page"}, "svc.asks.exec-7")
        await asyncio.wait_for(handled.wait(), 5)

    assert seen == {"body": {"ask": "page"}, "executor_id": "exec-7", "dependencies": {"name": "the service's"}}
    assert resolving_threads == {loop_thread}
    assert hops == [], "no parameter was resolved in a worker thread"


def test_the_resolvers_are_coroutines_so_fast_depends_awaits_them_instead_of_using_a_thread() -> None:
    assert asyncio.iscoroutinefunction(Context().use) and asyncio.iscoroutinefunction(Path().use)
