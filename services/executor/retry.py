"""Running one line with bounded retries: a 5xx reply is retried with backoff, a 4xx reply is final at once. An engine
raising on one line fails that line; only `EngineUnavailable` (no model, a crashed runtime) stops the attempt."""

import asyncio
import logging
from dataclasses import dataclass

from services.executor.adapters.engines.base import Engine, EngineReply, EngineUnavailable, error_reply

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LineRetry:
    attempts: int = 3
    """Tries of one line in all, the first included."""
    base_delay_s: float = 0.5
    """Backoff before the second try, doubled before each further one."""

    def delay_s(self, failures: int) -> float:
        return self.base_delay_s * 2 ** (failures - 1)


async def run_line(engine: Engine, endpoint: str, body: dict[str, object], retry: LineRetry) -> EngineReply:
    """The engine's reply to the line; the last 5xx reply when every try failed transiently."""
    reply = await _run_once(engine, endpoint, body)
    for failures in range(1, retry.attempts):
        if reply.status_code < 500:
            break
        log.warning("transient engine error %d (try %d of %d), retrying", reply.status_code, failures,
                    retry.attempts)
        await asyncio.sleep(retry.delay_s(failures))
        reply = await _run_once(engine, endpoint, body)
    return reply


async def _run_once(engine: Engine, endpoint: str, body: dict[str, object]) -> EngineReply:
    try:
        return await engine.run(endpoint, body)
    except EngineUnavailable:
        raise
    except Exception as error:
        log.exception("%s raised on a request line; the line gets a 500 reply", engine.name)
        return error_reply(500, f"The {engine.name} engine failed on this request ({type(error).__name__}).",
                           "engine_error")
