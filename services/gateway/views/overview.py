"""The operator's read-only views (admin keys): `GET /v1/organization/overview` (fleet, queue with why each batch
waits, running batches, free space per volume) and `GET /v1/admin/anomalies` (the facts the ledger refused, as it
projected them)."""

from aiohttp import web

from contracts.api.anomaly import Anomaly
from contracts.api.page import ListPage
from services.gateway.background.fleet_gauges import counted_census
from services.gateway.context import deps
from services.gateway.http.bodies import answer
from services.gateway.http.storage_guard import STORAGE_WATCH
from services.gateway.usecases.overview import gather


async def system_overview(request: web.Request) -> web.Response:
    context = deps(request)
    census = await counted_census(request.app)
    view = await gather(context.bus, context.read_model, context.fleet, census)
    view.counted = census.ready.is_set()
    watch = request.app.get(STORAGE_WATCH)
    view.volumes = list(watch.volumes) if watch is not None else []
    return web.json_response(view.as_dict())


async def list_anomalies(request: web.Request) -> web.Response:
    records = sorted(await deps(request).read_model.list_anomalies(), key=lambda r: r.sequence, reverse=True)
    data = [Anomaly(sequence=r.sequence, aggregate_type=r.aggregate_kind, aggregate_id=r.aggregate_id,
                    event_type=r.event_type, reason=r.reason, created_at=r.occurred_at) for r in records]
    return answer(ListPage[Anomaly](data=data))
