"""Running out of space: the reserve each volume keeps, its level, what a failed write is taken to mean, and the
answer the gateway gives for it (507 `insufficient_storage` / 503, never a 500), before and after the disk fills."""

import errno
import sqlite3
from pathlib import Path

import nats.errors
import nats.js.errors
import pytest
import urllib3.exceptions
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from minio.error import S3Error

from services.gateway.http.errors import error_middleware
from services.gateway.http.storage_guard import STORAGE_WATCH, refusal_for, storage_middleware
from services.runtime.process.settings import ConnectionSettings
from services.runtime.storage import write_failures
from services.runtime.storage.volumes import (
    MIN_RESERVE_BYTES,
    StorageWatch,
    VolumeSpace,
    measure_paths,
    reserve_for,
)
from services.runtime.storage.write_failures import ObjectStoreAnswered, through_write_faults, write_fault

MIB, GIB = 2**20, 2**30


@pytest.mark.parametrize(("total", "reserve"), [
    (200 * MIB, MIN_RESERVE_BYTES),       # 5 % is 10 MiB: a tiny disk keeps the 32 MiB floor
    (64 * MIB, 16 * MIB),                 # but never more than a quarter of it
    (10 * GIB, 512 * MIB),                # 5 %
    (100 * GIB, GIB),                     # at most 1 GiB
])
def test_the_reserve_is_five_percent_at_most_a_gibibyte_and_at_least_the_floor(total: int, reserve: int) -> None:
    assert reserve_for(total, 5.0, GIB) == reserve


def test_a_zero_share_or_cap_means_no_reserve() -> None:
    assert reserve_for(10 * GIB, 0, GIB) == 0
    assert reserve_for(10 * GIB, 5.0, 0) == 0


def test_a_volume_warns_under_twice_its_reserve_and_refuses_under_it() -> None:
    assert VolumeSpace.of("broker", "/x", GIB, 100 * MIB, 32 * MIB).level == "ok"
    assert VolumeSpace.of("broker", "/x", GIB, 60 * MIB, 32 * MIB).level == "warning"
    assert VolumeSpace.of("broker", "/x", GIB, 31 * MIB, 32 * MIB).level == "refusing"


def test_paths_are_measured_and_one_that_cannot_be_is_left_out(tmp_path: Path) -> None:
    volumes = measure_paths({"object_store": tmp_path, "gone": tmp_path / "missing"}, 5.0, GIB)
    assert [v.name for v in volumes] == ["object_store"]
    assert 0 <= volumes[0].free_bytes <= volumes[0].total_bytes


@pytest.mark.parametrize(("error", "fault"), [
    (nats.js.errors.ServiceUnavailableError(code=503, err_code=10023, description="insufficient resources"),
     "storage_full"),
    (nats.js.errors.APIError(code=500, err_code=10077, description="write msgs/1.blk: no space left on device"),
     "storage_full"),
    (nats.js.errors.ServiceUnavailableError(code=503, err_code=10076, description="jetstream not enabled"),
     "broker_unavailable"),
    (nats.js.errors.ServiceUnavailableError(), "broker_unavailable"),
    (nats.errors.TimeoutError(), "broker_unavailable"),
    (nats.errors.NoRespondersError(), "broker_unavailable"),
    (S3Error(None, "InsufficientStorage", "full", "r", "rid", "hid"), "storage_full"),  # type: ignore[arg-type]
    (urllib3.exceptions.MaxRetryError(None, "/sheshnag/x", "too many 500 error responses"),  # type: ignore[arg-type]
     "object_store_unavailable"),
    (OSError(errno.ENOSPC, "No space left on device"), "storage_full"),
    # An executor's presigned PUT, answered by a full SeaweedFS, a failing one, and one refusing the request.
    (ObjectStoreAnswered("PUT k", 500, "<Error><Message>No writable volumes</Message></Error>"), "storage_full"),
    (ObjectStoreAnswered("PUT k", 507), "storage_full"),
    (ObjectStoreAnswered("PUT k", 503, "<Error><Code>ServiceUnavailable</Code></Error>"), "object_store_unavailable"),
    (ObjectStoreAnswered("PUT k", 403, "<Error><Code>AccessDenied</Code></Error>"), None),
    (sqlite3.OperationalError("database or disk is full"), "storage_full"),
    (ValueError("a line that does not parse"), None),
    (nats.js.errors.BadRequestError(code=400, err_code=10058, description="stream name already in use"), None),
])
def test_a_failed_write_is_told_apart_from_other_failures(error: BaseException, fault: str | None) -> None:
    assert write_fault(error) == fault


def test_the_fault_is_found_in_what_the_error_was_raised_from() -> None:
    try:
        try:
            raise nats.errors.TimeoutError()
        except nats.errors.TimeoutError as inner:
            raise RuntimeError("publishing the fact failed") from inner
    except RuntimeError as outer:
        assert write_fault(outer) == "broker_unavailable"


SHORT = VolumeSpace.of("broker", "/data/nats", 128 * MIB, 10 * MIB, 32 * MIB)


def test_a_full_store_is_507_with_retry_after_and_a_broker_down_503() -> None:
    full = refusal_for(nats.js.errors.ServiceUnavailableError(code=503, err_code=10023), None)
    assert full is not None and (full.status, full.body.code, full.body.type) == (507, "insufficient_storage",
                                                                                  "server_error")
    assert full.retry_after_s
    down = refusal_for(nats.errors.TimeoutError(), None)
    assert down is not None and (down.status, down.body.code) == (503, "broker_unavailable")
    store = refusal_for(urllib3.exceptions.ProtocolError("reset"), None)
    assert store is not None and (store.status, store.body.code) == (503, "object_store_unavailable")
    assert refusal_for(KeyError("x"), None) is None


def test_a_broker_timeout_while_a_volume_is_short_is_said_to_be_the_space() -> None:
    refusal = refusal_for(nats.errors.TimeoutError(), SHORT)
    assert refusal is not None and refusal.status == 507
    assert "broker volume has 10.0 MiB free" in refusal.body.message


async def test_work_is_done_again_through_a_write_fault_and_other_failures_are_raised_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(write_failures, "FAULT_RETRY_S", (0.0,))
    tries: list[int] = []

    async def flaky() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise nats.errors.TimeoutError()
        return "done"

    assert await through_write_faults(flaky, "test") == "done" and len(tries) == 3

    async def broken() -> None:
        tries.append(1)
        raise ValueError("hopeless")

    tries.clear()
    with pytest.raises(ValueError):
        await through_write_faults(broken, "test")
    assert len(tries) == 1


async def _client(short: bool, failure: BaseException | None = None) -> TestClient[web.Request, web.Application]:
    async def handler(request: web.Request) -> web.Response:
        if failure is not None:
            raise failure
        return web.json_response({"ok": True})

    app = web.Application(middlewares=[error_middleware, storage_middleware])
    watch = StorageWatch(ConnectionSettings())
    watch.volumes = (SHORT,) if short else ()
    app[STORAGE_WATCH] = watch
    app.router.add_post("/v1/files", handler)
    app.router.add_get("/v1/files", handler)
    app.router.add_post("/v1/batches/{batch_id}/cancel", handler)
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


async def test_uploads_are_refused_under_the_reserve_while_reads_and_cancels_go_on() -> None:
    client = await _client(short=True)
    try:
        refused = await client.post("/v1/files", data=b"x")
        assert refused.status == 507
        assert refused.headers["Retry-After"] and refused.headers["x-should-retry"] == "false"
        body = await refused.json()
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert body["error"]["code"] == "insufficient_storage"
        assert (await client.get("/v1/files")).status == 200
        assert (await client.post("/v1/batches/batch_1/cancel")).status == 200
    finally:
        await client.close()


async def test_a_write_the_broker_did_not_take_is_answered_503_not_500() -> None:
    client = await _client(short=False, failure=nats.errors.TimeoutError())
    try:
        response = await client.post("/v1/batches/batch_1/cancel")
        assert response.status == 503
        assert (await response.json())["error"]["code"] == "broker_unavailable"
    finally:
        await client.close()


async def test_once_the_brokers_volume_is_full_every_write_is_507_at_once_and_reads_and_quotes_go_on() -> None:
    """On a full disk a publish is not even answered: a cancel waited out its 10 s timeout for the same 507."""
    app = web.Application(middlewares=[error_middleware, storage_middleware])
    watch = StorageWatch(ConnectionSettings())
    watch.volumes = (VolumeSpace.of("broker", "/data/nats", 100 << 20, 512 << 10, 5 << 20),)
    app[STORAGE_WATCH] = watch

    async def handler(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app.router.add_get("/v1/files", handler)
    app.router.add_post("/v1/batches/quote", handler)
    app.router.add_post("/v1/batches/{batch_id}/cancel", handler)
    app.router.add_delete("/v1/files/{file_id}", handler)
    client = TestClient(TestServer(app))
    await client.start_server()
    try:
        for refused in (await client.post("/v1/batches/batch_1/cancel"), await client.delete("/v1/files/file-1")):
            assert refused.status == 507 and (await refused.json())["error"]["code"] == "insufficient_storage"
        assert (await client.get("/v1/files")).status == 200
        assert (await client.post("/v1/batches/quote")).status == 200

        watch.volumes = (VolumeSpace.of("broker", "/data/nats", 100 << 20, 2 << 20, 5 << 20),)  # short, not full
        assert (await client.post("/v1/batches/batch_1/cancel")).status == 200
    finally:
        await client.close()
