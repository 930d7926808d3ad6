"""Composition root of the gateway: `create_app(settings)` with one cleanup context per resource."""

from collections.abc import AsyncIterator

from aiohttp import web

from services.gateway.auth import KEY_CACHE, KeyCache, auth_middleware
from services.gateway.context import DEPS, Deps
from services.gateway.errors import error_middleware
from services.gateway.routes import ROUTES
from services.gateway.settings import GatewaySettings
from services.runtime.bus import EventBus
from services.runtime.catalogue import load_catalogue
from services.runtime.objectstore import ObjectStore
from services.runtime.readmodel import ReadModel


def create_app(settings: GatewaySettings) -> web.Application:
    app = web.Application(middlewares=[error_middleware, auth_middleware],
                          client_max_size=settings.max_upload_bytes + 1024 * 1024)

    async def connections(app: web.Application) -> AsyncIterator[None]:
        connection = settings.connection
        bus = await EventBus.connect(connection.nats_url, "gateway")
        store = ObjectStore.from_settings(connection)
        await store.ensure_bucket()
        read_model = await ReadModel.open(bus)
        app[DEPS] = Deps(settings, bus, store, read_model, load_catalogue(connection.catalogue_path))
        app[KEY_CACHE] = KeyCache(read_model)
        yield
        await bus.close()

    app.cleanup_ctx.append(connections)
    app.add_routes(ROUTES)
    return app
