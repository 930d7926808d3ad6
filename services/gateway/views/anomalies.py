"""`GET /v1/admin/anomalies` (admin, read-only): the facts the ledger refused, as it projected them."""

from aiohttp import web

from contracts.api.anomaly import Anomaly
from contracts.api.page import ListPage
from services.gateway.context import deps
from services.gateway.http.answers import answer
from services.gateway.http.auth import require_admin


async def list_anomalies(request: web.Request) -> web.Response:
    """Admin: the facts the ledger refused, newest first."""
    require_admin(request)
    records = sorted(await deps(request).read_model.list_anomalies(), key=lambda r: r.sequence, reverse=True)
    data = [Anomaly(sequence=r.sequence, aggregate_type=r.aggregate_kind, aggregate_id=r.aggregate_id,
                    event_type=r.event_type, reason=r.reason, created_at=r.occurred_at) for r in records]
    return answer(ListPage[Anomaly](data=data))

