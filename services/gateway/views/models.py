"""`/v1/models`: the catalogue, as OpenAI lists models, narrowed to what the caller's key may use."""

from aiohttp import web

from contracts.api.model import Model
from contracts.api.organization import ModelAlias
from contracts.api.page import ListPage
from contracts.catalogue import CatalogueModel
from services.gateway.context import deps
from services.gateway.http.auth import principal
from services.gateway.http.bodies import answer
from services.gateway.usecases.refusals import not_found


def as_model(entry: CatalogueModel) -> Model:
    return Model(id=entry.id, created=entry.created, owned_by=entry.owned_by, revision=entry.served_revision,
                 supports_tools=entry.supports_tools)


async def usable_models(request: web.Request) -> list[CatalogueModel]:
    """The catalogue entries the caller's user may use (every one unless their access is restricted)."""
    user = await deps(request).keys.user_of(principal(request))
    allowed = None if user is None else user.allowed_models  # None: every model (also for a key without a user)
    models = deps(request).catalogue.models
    return list(models) if allowed is None else [m for m in models if m.id in allowed]


async def list_models(request: web.Request) -> web.Response:
    return answer(ListPage[Model](data=[as_model(m) for m in await usable_models(request)]))


async def list_aliases(request: web.Request) -> web.Response:
    aliases = [ModelAlias(alias=alias, model=m.id) for m in await usable_models(request) for alias in m.aliases]
    return answer(ListPage[ModelAlias](data=aliases))


async def retrieve_model(request: web.Request) -> web.Response:
    name = request.match_info["model_id"]
    entry = deps(request).catalogue.resolve(name)
    if entry is None or entry not in await usable_models(request):
        raise not_found("model", name)
    return answer(as_model(entry))
