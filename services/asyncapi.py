"""The AsyncAPI document of the event catalogue, generated from the workers' declared routers (faststream's
AsyncAPI support): every fact a service consumes or emits, with its payload schema. The gateway serves it at
`/asyncapi.json`; `python -m services.asyncapi` prints it. A worker whose router is declared joins `ROUTERS`.
"""

import json
from collections.abc import Callable
from typing import Any

from faststream.nats import NatsBroker, NatsRouter
from faststream.specification import AsyncAPI

from services.validator.handlers import validator_router

ROUTERS: tuple[Callable[[], NatsRouter], ...] = (validator_router,)
TITLE = "Sheshnag event catalogue"
DESCRIPTION = ("Every fact on the EVENTS stream (JetStream, subjects `evt.<aggregate>.<id>.<fact>`) that a "
               "service emits or consumes, with its payload schema. Channels are named `<service or durable>:"
               "<subject filter>`; each publish carries a deterministic `Nats-Msg-Id` (the event_id).")


def event_catalogue() -> dict[str, Any]:
    """The document, as JSON-ready data (on a broker of its own, fresh routers: nothing connects)."""
    broker = NatsBroker("nats://localhost:4222", specification_url="nats://nats:4222")
    for router in ROUTERS:
        broker.include_router(router())
    specification = AsyncAPI(broker, title=TITLE, version="1", description=DESCRIPTION)
    document: dict[str, Any] = specification.to_specification().to_jsonable()
    return document


if __name__ == "__main__":
    print(json.dumps(event_catalogue(), indent=2))
