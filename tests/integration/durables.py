"""A durable pull consumer made and bound by hand, as a service's router makes it: created first (an existing one keeps
its position and config), then bound, never looked up. An admitted executor's are made by its scheduler (`made_by`):
the executor only binds."""

import contextlib
from collections.abc import Sequence

import nats.js.errors
from nats.js import JetStreamContext

from services.runtime.nats.bus import ConsumerPolicy, EventBus
from services.runtime.nats.delivery import Durable


async def durable_subscription(bus: EventBus, stream: str, durable: str, subjects: Sequence[str],
                               policy: ConsumerPolicy, made_by: EventBus | None = None,
                               pulls_via: str | None = None) -> JetStreamContext.PullSubscription:
    """`pulls_via`: the JetStream API prefix the pulls go through (an admitted executor's: a scheduler relays them)."""
    single = len(subjects) == 1
    config = Durable(None, stream, durable, subjects[0] if single else "", policy,
                     () if single else tuple(subjects)).consumer_config()
    with contextlib.suppress(nats.js.errors.BadRequestError):
        await (made_by or bus).js.add_consumer(stream, config)
    js = bus.js if pulls_via is None else JetStreamContext(bus.nc, prefix=pulls_via)
    return await js.pull_subscribe_bind(durable=durable, stream=stream)
