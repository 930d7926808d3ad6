"""The gateway's `/metrics` (issue 29, attack 7): admin keys only, a scrape reads nothing from the read model however
many batches it holds, the gauges' refresh reads no batch record (the census counts batches as their records
change), and no label value names a tenant."""

import asyncio
import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from contracts.api.batch import Batch
from contracts.api.batch import BatchStatus as Status
from contracts.readmodel import BatchRecord
from services.gateway.background.fleet_gauges import BATCH_CENSUS, refresh_gauges
from services.gateway.context import DEPS
from services.runtime.nats import readmodel
from services.runtime.nats.readmodel import ReadModel
from services.runtime.process.settings import ConnectionSettings
from tests.integration.gateway_support import Gateway, running_gateway
from tests.integration.test_gateway_tenancy import admin_key, read_model
from tests.support import put_batch

STATUSES: tuple[Status, ...] = ("validated", "in_progress", "completed")
LABEL = re.compile(r'(\w+)="([^"]*)"')
TENANT_ID = re.compile(r"^(batch_|file-|key_|user-|gk-|u-)")


@pytest.fixture(scope="module")
async def gateway(connection: ConnectionSettings) -> AsyncIterator[Gateway]:
    # The timer refreshes once at start and not again during these tests: each scrape here is the scrape alone.
    async with running_gateway(connection, metrics_refresh_s=3600) as running:
        yield running


async def write_batches(gateway: Gateway, tag: str, first: int, count: int) -> list[str]:
    """Batch records put straight into the read model (as the ledger would), owned by a user of this test."""
    ids = []
    for i in range(first, first + count):
        batch = Batch(id=f"batch_{tag}{i}", endpoint="/v1/chat/completions", input_file_id=f"file-{tag}{i}",
                      completion_window="24h", status=STATUSES[i % len(STATUSES)], created_at=1_700_000_000,
                      model="tiny-model")
        await put_batch(read_model(gateway), BatchRecord(owner_key_id=f"key_{tag}", owner_user_id=f"user-{tag}",
                                                         batch=batch, last_sequence=1))
        ids.append(batch.id)
    return ids


class ReadCounter:
    """Counts the records of this test's batches (their ids hold `tag`) that the read model reads (scans' records and
    single gets), by wrapping its module's reads: what other tests' batches make this gateway read meanwhile (its
    webhook intake reads the record of each batch fact it takes, on a broker the tests share) is not counted."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, tag: str) -> None:
        self.records = 0
        self.tag = tag
        for name in ("latest_values", "latest_entries"):
            monkeypatch.setattr(readmodel, name, self._counting(getattr(readmodel, name)))
        monkeypatch.setattr(ReadModel, "_get", self._counting_get(ReadModel._get))

    def _counting(self, scan: Callable[..., Awaitable[list[Any]]]) -> Callable[..., Awaitable[list[Any]]]:
        async def counted(*args: Any, **kwargs: Any) -> list[Any]:
            found = await scan(*args, **kwargs)
            if "batch" in str(kwargs.get("key_filter", args[1] if len(args) > 1 else ">")):
                self.records += sum(1 for item in found if self.tag in str(item))
            return found
        return counted

    def _counting_get(self, get: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def counted(read_model: ReadModel, key: str, model: type[Any]) -> Any:
            if model is BatchRecord and self.tag in key:
                self.records += 1
            return await get(read_model, key, model)
        return counted


async def test_metrics_refuse_anonymous_callers_and_user_keys_and_serve_admin_keys(gateway: Gateway) -> None:
    anonymous = await gateway.client.get("/metrics")
    assert anonymous.status == 401
    assert (await anonymous.json())["error"]["type"] == "authentication_error"
    user = await gateway.client.get("/metrics", headers=await gateway.new_key())
    assert user.status == 403
    assert (await user.json())["error"]["code"] == "insufficient_permissions"
    admin = await gateway.client.get("/metrics", headers=await admin_key(gateway))
    assert admin.status == 200
    assert "sheshnag_http_requests_total" in await admin.text()


async def counted_after(gateway: Gateway, ids: list[str]) -> None:
    """Wait until the census has counted each of `ids` (it follows the read model's batch records)."""
    census = gateway.client.app[BATCH_CENSUS]
    for _ in range(400):
        if all(i in census.open or i in census.recently_ended for i in ids):
            return
        await asyncio.sleep(0.025)
    raise TimeoutError("the census never counted the batches written")


def gauge(page: str, status: str) -> float:
    found = re.search(rf'^sheshnag_batches\{{status="{status}"\}} (\S+)$', page, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


async def test_a_scrape_and_a_refresh_read_no_batch_record_with_5_or_200_batches_and_count_them_all(
        gateway: Gateway, monkeypatch: pytest.MonkeyPatch) -> None:
    admin, tag = await admin_key(gateway), secrets.token_hex(4)
    app = gateway.client.app
    assert (await gateway.client.get("/metrics", headers=admin)).status == 200  # the key is cached from here
    await refresh_gauges(app[DEPS], app[BATCH_CENSUS])
    start = {status: gauge(await (await gateway.client.get("/metrics", headers=admin)).text(), status)
             for status in STATUSES}
    counter = ReadCounter(monkeypatch, tag)
    reads = []
    for first, count in ((0, 5), (5, 195)):
        await counted_after(gateway, await write_batches(gateway, tag, first, count))
        counter.records = 0
        await refresh_gauges(app[DEPS], app[BATCH_CENSUS])  # the timer's work
        page = await (await gateway.client.get("/metrics", headers=admin)).text()
        reads.append(counter.records)
        written = first + count
        assert {status: gauge(page, status) - start[status] for status in STATUSES} == {
            status: float(sum(1 for i in range(written) if STATUSES[i % len(STATUSES)] == status))
            for status in STATUSES}
    assert reads == [0, 0]


async def test_no_label_value_of_the_page_names_a_tenant(gateway: Gateway) -> None:
    admin, tag = await admin_key(gateway), secrets.token_hex(4)
    ids = await write_batches(gateway, tag, 0, 6)
    await counted_after(gateway, ids)
    await refresh_gauges(gateway.client.app[DEPS], gateway.client.app[BATCH_CENSUS])
    page = await (await gateway.client.get("/metrics", headers=admin)).text()
    assert re.search(r'^sheshnag_batches\{status="validated"\} \d', page, re.MULTILINE), page
    values = {value for _, value in LABEL.findall(page)}
    named = {value for value in values if TENANT_ID.match(value) or tag in value}
    assert named == set(), named
    assert not any(batch_id in page for batch_id in ids)
