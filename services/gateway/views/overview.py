"""`GET /v1/organization/overview` (admin, read-only): fleet, queue with why each batch waits, running batches."""

from aiohttp import web

from services.gateway.auth import require_admin
from services.gateway.context import deps
from services.runtime.overview import gather


async def system_overview(request: web.Request) -> web.Response:
    require_admin(request)
    context = deps(request)
    view = await gather(context.bus, context.read_model, context.fleet)
    return web.json_response(view.as_dict())
