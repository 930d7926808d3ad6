"""`GET /asyncapi.json` through the real gateway: the event catalogue the workers' routers declare, public like
`/openapi.json`."""

from collections.abc import AsyncIterator

import pytest

from services.asyncapi import event_catalogue
from services.runtime.process.settings import ConnectionSettings
from tests.integration.gateway_support import Gateway, running_gateway


@pytest.fixture(scope="module")
async def gateway(connection: ConnectionSettings) -> AsyncIterator[Gateway]:
    async with running_gateway(connection) as running:
        yield running


async def test_anyone_reads_the_event_catalogue_the_declared_routers_generate(gateway: Gateway) -> None:
    answer = await gateway.client.get("/asyncapi.json")
    assert answer.status == 200 and answer.content_type == "application/json"
    document = await answer.json()
    assert document == event_catalogue()
    assert "validator:evt.batch.*.created" in document["channels"]

