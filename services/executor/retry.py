"""Running one line with bounded retries: a 5xx reply is retried with backoff, a 4xx reply is final at once."""

import asyncio
import logging
from dataclasses import dataclass

from services.executor.adapters.engines.base import Engine, EngineReply

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
    reply = await engine.run(endpoint, body)
    for failures in range(1, retry.attempts):
        if reply.status_code < 500:
            break
        log.warning("transient engine error %d (try %d of %d), retrying", reply.status_code, failures,
                    retry.attempts)
        await asyncio.sleep(retry.delay_s(failures))
        reply = await engine.run(endpoint, body)
    return reply
