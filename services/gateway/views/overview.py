"""`GET /v1/organization/overview` (admin, read-only): fleet, queue with why each batch waits, running batches, free
space per volume."""

from aiohttp import web

from services.gateway.context import deps
from services.gateway.http.auth import require_admin
from services.gateway.http.storage_guard import STORAGE_WATCH
from services.gateway.usecases.overview import gather


async def system_overview(request: web.Request) -> web.Response:
    require_admin(request)
    context = deps(request)
    view = await gather(context.bus, context.read_model, context.fleet)
    watch = request.app.get(STORAGE_WATCH)
    view.volumes = list(watch.volumes) if watch is not None else []
    return web.json_response(view.as_dict())
