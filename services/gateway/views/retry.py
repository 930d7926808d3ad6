"""`POST /v1/batches/{id}/retry`: a new batch of the lines that failed in an ended one, linked to it; the rules are
the use case's (`usecases.retry`)."""

from aiohttp import web

from services.gateway.context import deps
from services.gateway.http.answers import answer
from services.gateway.http.auth import principal
from services.gateway.http.bodies import read_body
from services.gateway.http.limits import charge_control_call
from services.gateway.usecases import retry as usecase
from services.gateway.usecases.batches import owned_batch
from services.gateway.usecases.retry import RetryRequest

MAX_BODY_BYTES = 64 * 1024


async def retry_batch(request: web.Request) -> web.Response:
    await charge_control_call(request)
    d, caller = deps(request), principal(request)
    body = await read_body(request, RetryRequest, MAX_BODY_BYTES)
    record = await owned_batch(d, caller, request.match_info["batch_id"])
    created = await usecase.retry(d, caller, record, body)
    return answer(created.batch, created.same_as)
