"""Composition root of the gateway: `create_app(settings)` with one cleanup context per resource; its connection is
its broker's, which runs the gateway's router (the webhook intake) once the dependencies are made."""

from collections.abc import AsyncIterator

from aiohttp import web

from contracts.subjects import EVENTS_STREAM, LIMITS_BUCKET, WEBHOOKS_BUCKET
from services.gateway.adapters.admission import ADMISSION_WAIT_S, Admission
from services.gateway.adapters.fold_notices import FOLDS, fold_notice_router
from services.gateway.adapters.key_cache import KeyCache
from services.gateway.adapters.shared_state import SharedState
from services.gateway.background.credit_sweeper import credit_sweeper
from services.gateway.background.fleet_gauges import fleet_gauges
from services.gateway.background.key_usage import keys_kept_fresh
from services.gateway.background.loops import running
from services.gateway.background.orphans import orphan_sweeper
from services.gateway.background.sweeper import file_sweeper
from services.gateway.context import DEPS, Deps
from services.gateway.dashboard.pages import add_dashboard
from services.gateway.http.auth import auth_middleware
from services.gateway.http.auth_failures import AUTH_FAILURES, FailedAuthentications, SharedFailedAuthentications
from services.gateway.http.errors import error_middleware
from services.gateway.http.limits import CONTROL_LIMITER, ControlCallLimiter
from services.gateway.http.observe import observe_middleware
from services.gateway.http.readiness import READINESS, Readiness
from services.gateway.http.refusal_pacing import REFUSAL_PACER, RefusalPacer, pacing_middleware
from services.gateway.http.request_ids import stamp_request_id
from services.gateway.http.routes import ROUTES
from services.gateway.http.storage_guard import storage_middleware, storage_watch
from services.gateway.http.transfer_slots import (
    DOWNLOAD_SLOTS,
    OPEN_STREAMS,
    UPLOAD_SLOTS,
    UPLOADS_IN_FLIGHT,
    AtOnce,
    FairSlots,
    too_many_streams,
    too_many_uploads,
    upload_address_middleware,
)
from services.gateway.settings import GatewaySettings
from services.gateway.webhooks.deliverer import WEBHOOK_DIRECTORY, WEBHOOK_STORE, webhook_deliverer
from services.gateway.webhooks.directory import EndpointDirectory
from services.gateway.webhooks.intake import WEBHOOKS, WebhookIntake, webhook_router
from services.gateway.webhooks.store import WebhookStore
from services.runtime.nats.bus import EventBus
from services.runtime.nats.fleet import Fleet
from services.runtime.nats.kv import ensure_direct_reads, open_bucket
from services.runtime.nats.readmodel import ReadModel
from services.runtime.nats.revocations import RevocationCheck
from services.runtime.process import metrics
from services.runtime.storage.catalogue import load_catalogue
from services.runtime.storage.objectstore import ObjectStore


def create_app(settings: GatewaySettings) -> web.Application:
    metrics.register("gateway")
    app = web.Application(middlewares=[observe_middleware, pacing_middleware, error_middleware,
                                       upload_address_middleware, auth_middleware, storage_middleware],
                          client_max_size=settings.max_upload_bytes + 1024 * 1024)

    async def connections(app: web.Application) -> AsyncIterator[None]:
        connection = settings.connection
        bus = await EventBus.connect(connection.nats_url, "gateway")
        broker = bus.broker
        store = ObjectStore.from_settings(connection)
        await store.ensure_bucket()
        await ensure_direct_reads(bus.js, EVENTS_STREAM)  # the errors view reads facts without a consumer
        read_model = await ReadModel.open(bus)
        keys = KeyCache(read_model, await RevocationCheck.open(bus))
        shared = SharedState(await open_bucket(bus, LIMITS_BUCKET))
        # A limit is decided by the bucket or not at all: a slow broker is waited for rather than answered with 503.
        admission = Admission(SharedState(shared.kv, timeout_s=max(settings.read_your_writes_s, ADMISSION_WAIT_S),
                                          retry_after_s=0.0))
        app[DEPS] = Deps(settings, bus, store, read_model, load_catalogue(connection.catalogue_path),
                         await Fleet.open(bus), admission, keys)
        app[CONTROL_LIMITER] = ControlCallLimiter(shared, settings.control_calls_per_s, settings.control_call_burst)
        if settings.auth_failure_limit > 0:
            app[AUTH_FAILURES] = SharedFailedAuthentications(
                shared, FailedAuthentications(settings.auth_failure_limit, settings.auth_failure_window_s))
        app[WEBHOOK_STORE] = webhooks = WebhookStore(await open_bucket(bus, WEBHOOKS_BUCKET, scans=True))
        app[WEBHOOK_DIRECTORY] = directory = EndpointDirectory()
        broker.include_router(fold_notice_router())
        broker.context.set_global(FOLDS, app[DEPS].folds)
        if settings.webhooks:  # every gateway takes the facts webhooks are sent for (each fact one of them)
            broker.include_router(webhook_router())
            broker.context.set_global(WEBHOOKS, WebhookIntake(webhooks, directory, read_model))
        async with running(directory.follow(webhooks.kv)):  # lists and limits read it, delivering or not
            await broker.start()
            yield
        app[READINESS].close()
        store.close()
        await broker.close_within()

    app[READINESS] = Readiness.from_settings(settings.connection)
    app[REFUSAL_PACER] = RefusalPacer(settings.refusal_pace_budget, settings.refusal_pace_window_s,
                                      settings.refusal_pace_delay_s)
    app[UPLOAD_SLOTS] = FairSlots(settings.upload_slots, settings.upload_slots_per_owner,
                                  settings.transfer_slot_wait_s)
    app[DOWNLOAD_SLOTS] = FairSlots(settings.download_slots, settings.download_slots_per_owner,
                                    settings.transfer_slot_wait_s)
    app[UPLOADS_IN_FLIGHT] = AtOnce(settings.uploads_per_address, too_many_uploads)
    app[OPEN_STREAMS] = AtOnce(settings.event_streams_per_owner, too_many_streams)
    app.on_response_prepare.append(stamp_request_id)
    app.cleanup_ctx.extend([connections, storage_watch, keys_kept_fresh,
                            file_sweeper, orphan_sweeper, credit_sweeper, fleet_gauges, webhook_deliverer])
    app.add_routes(ROUTES)
    add_dashboard(app)
    return app
