"""`/v1/models`: the catalogue, as OpenAI lists models."""

from aiohttp import web

from contracts.api.model import Model
from contracts.api.page import ListPage
from contracts.catalogue import CatalogueModel
from services.gateway.context import deps
from services.gateway.errors import not_found


def as_model(entry: CatalogueModel) -> Model:
    return Model(id=entry.id, created=entry.created, owned_by=entry.owned_by)


async def list_models(request: web.Request) -> web.Response:
    page = ListPage[Model](data=[as_model(m) for m in deps(request).catalogue.models])
    return web.json_response(page.model_dump(mode="json"))


async def retrieve_model(request: web.Request) -> web.Response:
    name = request.match_info["model_id"]
    entry = deps(request).catalogue.resolve(name)
    if entry is None:
        raise not_found("model", name)
    return web.json_response(as_model(entry).model_dump(mode="json"))
