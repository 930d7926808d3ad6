"""Running out of space: uploads and batches are refused (507 `insufficient_storage`) while a watched volume is under
its reserve, and a write the broker or store could not take is answered 507/503 at once, not 500. Reads, downloads
and cancels are not refused early: they free space or need little; only once the broker's volume is full (under
1 MiB, where no publish is even answered) is every write answered 507 at once rather than after its timeout."""

import contextlib
import logging
from collections.abc import AsyncIterator

from aiohttp import web
from aiohttp.typedefs import Handler

from contracts.api.error_codes import BROKER_UNAVAILABLE, INSUFFICIENT_STORAGE
from services.gateway.adapters.upload import store_unavailable
from services.gateway.background.loops import running
from services.gateway.context import DEPS
from services.gateway.http.errors import error_response
from services.gateway.usecases.refusals import ApiError
from services.runtime.storage.volumes import StorageWatch, VolumeSpace
from services.runtime.storage.write_failures import write_fault

log = logging.getLogger(__name__)

STORAGE_WATCH = web.AppKey("storage_watch", StorageWatch)
GUARDED = frozenset({("POST", "/v1/files"), ("POST", "/v1/batches"), ("POST", "/v1/batches/{batch_id}/retry")})
"""The requests that add data: refused while a volume is under its reserve."""
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
READS_BY_POST = frozenset({("POST", "/v1/batches/quote")})
FULL_RETRY_AFTER_S = 30
BROKER_RETRY_AFTER_S = 5


def insufficient_storage(volume: VolumeSpace | None) -> ApiError:
    why = volume.describe() if volume is not None else "a write failed for lack of space"
    return ApiError(507, f"The server is out of storage space ({why}); nothing of this request was kept. New "
                    "uploads and batches are refused until space is freed; reads, downloads, cancels and running "
                    "batches go on.", "server_error", INSUFFICIENT_STORAGE, retry_after_s=FULL_RETRY_AFTER_S)


def broker_unavailable(error: BaseException) -> ApiError:
    return ApiError(503, f"The broker is not taking writes now ({type(error).__name__}); nothing of this request was "
                    "kept. Try again shortly.", "server_error", BROKER_UNAVAILABLE, retry_after_s=BROKER_RETRY_AFTER_S)


def refusal_for(error: BaseException, short: VolumeSpace | None) -> ApiError | None:
    """The answer to a write that failed with `error` while `short` is under its reserve; None: a real 500."""
    fault = write_fault(error)
    if fault is None:
        return None
    if fault == "storage_full" or short is not None:
        return insufficient_storage(short)
    return broker_unavailable(error) if fault == "broker_unavailable" else store_unavailable(error)


def is_write(request: web.Request) -> bool:
    """Whether the request states something (each such writes to the broker): all but reads and a quote."""
    route = request.match_info.route
    return request.method in WRITE_METHODS and not (
        route.resource is not None and (request.method, route.resource.canonical) in READS_BY_POST)


def is_guarded(request: web.Request) -> bool:
    route = request.match_info.route
    return route.resource is not None and (request.method, route.resource.canonical) in GUARDED


def render(refusal: ApiError) -> web.Response:
    response = error_response(refusal)
    if refusal.status == 507:  # a clear answer now: the SDK would otherwise wait and retry it twice
        response.headers["x-should-retry"] = "false"
    return response


@web.middleware
async def storage_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    watch = request.app.get(STORAGE_WATCH)
    if watch is not None and (short := watch.short()) is not None and is_guarded(request):
        return render(insufficient_storage(short))
    if watch is not None and is_write(request) and (full := watch.broker_full()) is not None:
        return render(insufficient_storage(full))
    try:
        return await handler(request)
    except ApiError as error:
        if error.body.code == "object_store_unavailable" and watch is not None and (short := watch.short()):
            return render(insufficient_storage(short))
        raise
    except web.HTTPException:
        raise
    except Exception as error:
        refusal = refusal_for(error, watch.short() if watch is not None else None)
        if refusal is None:
            raise
        log.warning("%s %s answered %d %s: %r", request.method, request.path, refusal.status, refusal.body.code, error)
        return render(refusal)


async def storage_watch(app: web.Application) -> AsyncIterator[None]:
    """The watch of the volumes, refreshed in the background for as long as the app runs (after `connections`)."""
    deps = app[DEPS]
    watch = app[STORAGE_WATCH] = StorageWatch(deps.settings.connection, deps.bus.js)
    with contextlib.suppress(OSError):
        await watch.refresh()
    async with running(watch.run()):
        yield
