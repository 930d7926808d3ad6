"""A fact in hand when its service stops: given back at once (nak) where its durable says so (the validator's, which
holds up to 64 leased while they wait for a turn), else left for its ack wait as before."""

import asyncio
from typing import Any, cast

from faststream import ContextRepo
from nats.aio.msg import Msg

from contracts.events.batch import BatchCreated
from contracts.subjects import BATCH_CREATED, EVENTS_STREAM
from services.runtime.nats.bus import ConsumerPolicy
from services.runtime.nats.delivery import Durable, ServiceRouter, _Delivery
from services.validator.handlers import validator_router


class Client:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    async def publish(self, subject: str, payload: bytes = b"", **_: object) -> None:
        self.sent.append((subject, payload))


def held(consumer: str, client: Client) -> Msg:
    return Msg(cast(Any, client), subject="evt.batch.b1.created", reply=f"$JS.ACK.EVENTS.{consumer}.1.7.7.1.0",
               data=b"{}")


async def stopped_while_held(router: ServiceRouter, consumer: str) -> list[tuple[str, bytes]]:
    client = Client()
    delivery = _Delivery(held(consumer, client), context=ContextRepo(), router=router)
    await delivery.on_receive()
    await delivery.after_processed(asyncio.CancelledError, asyncio.CancelledError(), None)
    return [(subject, payload) for subject, payload in client.sent if payload != b"+WPI"]


async def test_the_validators_batches_in_hand_are_given_back_when_it_stops() -> None:
    sent = await stopped_while_held(validator_router(), "validator")
    assert sent == [("$JS.ACK.EVENTS.validator.1.7.7.1.0", b"-NAK")]


async def test_other_durables_leave_a_fact_in_hand_to_its_ack_wait() -> None:
    router = ServiceRouter("tests", dependencies="tests")

    async def take(deps: object, fact: BatchCreated) -> None:
        return None

    router.durable(Durable(BatchCreated, EVENTS_STREAM, "tests-plain", BATCH_CREATED, ConsumerPolicy()), take, None,
                   "A durable of the default policy.")
    assert await stopped_while_held(router, "tests-plain") == []
