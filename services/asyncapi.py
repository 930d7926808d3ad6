"""The AsyncAPI document of the event catalogue, generated from the services' declared routers (faststream's
AsyncAPI support): every fact a service consumes or emits, with its payload schema. `python -m services.asyncapi`
writes it to `services/gateway/asyncapi.json`, the checked-in file the gateway serves at `/asyncapi.json` (so the
gateway imports no worker; a test fails while the file differs from what this module generates). A worker whose
router is declared joins `ROUTERS`.
"""

import json
import sys
import typing
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from faststream.nats import NatsBroker, NatsRouter
from faststream.specification import AsyncAPI

from contracts.events.envelope import Event
from services.executor.handlers import executor_router
from services.gateway.webhooks.intake import webhook_router
from services.ledger.handlers import ledger_router
from services.runtime.nats.delivery import ServiceRouter, fact_filter
from services.scheduler.handlers import scheduler_router
from services.validator.handlers import validator_router

ROUTERS: tuple[Callable[[], NatsRouter], ...] = (
    validator_router, scheduler_router, lambda: executor_router(EXECUTOR_ID, ack_wait_s=30.0, max_deliver=5),
    ledger_router, webhook_router)
EXECUTOR_ID = "{executor_id}"
"""Each executor's durables and commands carry its id: the document names it as a subject parameter."""
TITLE = "Sheshnag event catalogue"
DESCRIPTION = ("Every fact on the EVENTS stream (JetStream, subjects `evt.<aggregate>.<id>.<fact>`) that a "
               "service emits or consumes, every command on the WORK stream (`cmd.executor.<id>.<command>`) and "
               "every core request/reply subject (`svc.…`), with its payload schema. Channels are named `<service "
               "or durable>:<subject filter>`, a fold of the whole log `<name>.fold:<filter>`; each publish carries "
               "a deterministic `Nats-Msg-Id` (the event_id).")


def event_catalogue() -> dict[str, Any]:
    """The document, as JSON-ready data (on a broker of its own, fresh routers: nothing connects)."""
    broker = NatsBroker("nats://localhost:4222", specification_url="nats://nats:4222")
    for make_router in ROUTERS:
        router = make_router()
        broker.include_router(router)
        if isinstance(router, ServiceRouter):
            broker.include_router(router.term)  # its leader-only answers
            for follower in router.followers:
                broker.include_router(_as_documented(f"{follower.name}.fold", follower.contracts, follower.description))
            for declared in router.declared.values():
                if declared.durable.filter_subjects:  # a durable of several facts: a channel for each
                    facts = typing.get_args(typing.get_args(declared.durable.contract)[0])
                    broker.include_router(_as_documented(declared.durable.name, facts, declared.description))
    specification = AsyncAPI(broker, title=TITLE, version="1", description=DESCRIPTION)
    document: dict[str, Any] = specification.to_specification().to_jsonable()
    return document


def _as_documented(name: str, contracts: Iterable[type[Event]], description: str) -> NatsRouter:
    """Facts taken as one receiving channel each, on a router only this document includes (a fold reads the log with
    the ordered reader, a durable of several facts has one subscriber for them all): nothing here ever subscribes."""
    router = NatsRouter()
    for contract in contracts:
        subject = fact_filter(contract)
        router.subscriber(subject, title=f"{name}:{subject}", description=description)(_takes(contract))
    return router


def _takes(contract: type[Event]) -> Callable[..., Any]:
    async def fold(fact: Any) -> None:
        """Documentation only: the fold runs elsewhere."""

    fold.__annotations__ = {"fact": contract, "return": None}
    return fold


DOCUMENT = Path(__file__).parent / "gateway" / "asyncapi.json"
"""The checked-in document the gateway serves."""


def rendered() -> str:
    """The document as the checked-in file holds it."""
    return json.dumps(event_catalogue(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] == ["-"]:  # `python -m services.asyncapi -`: to standard output instead
        sys.stdout.write(rendered())
    else:
        DOCUMENT.write_text(rendered())
        print(f"wrote {DOCUMENT}")
