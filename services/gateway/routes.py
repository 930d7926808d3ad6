"""The route table."""

from aiohttp import web

from services.gateway.openapi import openapi_json
from services.gateway.views import (
    anomalies,
    batches,
    errors,
    events,
    files,
    models,
    organization,
    overview,
    provider,
)


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


ROUTES = [
    web.get("/healthz", healthz),
    web.get("/openapi.json", openapi_json),
    web.get("/v1/models", models.list_models),
    web.get("/v1/models/aliases", models.list_aliases),
    web.get("/v1/models/{model_id}", models.retrieve_model),
    web.post("/v1/files", files.create_file),
    web.get("/v1/files", files.list_files),
    web.get("/v1/files/{file_id}", files.retrieve_file),
    web.get("/v1/files/{file_id}/content", files.file_content),
    web.delete("/v1/files/{file_id}", files.delete_file),
    web.post("/v1/batches", batches.create_batch),
    web.get("/v1/batches", batches.list_batches),
    web.get("/v1/batches/{batch_id}", batches.retrieve_batch),
    web.post("/v1/batches/{batch_id}/cancel", batches.cancel_batch),
    web.post("/v1/batches/{batch_id}/release", batches.release_batch),
    web.get("/v1/batches/{batch_id}/events", events.stream_batch_events),
    web.get("/v1/batches/{batch_id}/errors", errors.batch_errors),
    web.post("/v1/organization/users", organization.create_user),
    web.get("/v1/organization/users", organization.list_users),
    web.post("/v1/organization/organizations", organization.create_organization),
    web.get("/v1/organization/organizations", organization.list_organizations),
    web.get("/v1/organization/organizations/{organization_id}", organization.retrieve_organization),
    web.post("/v1/organization/keys", organization.create_key),
    web.get("/v1/organization/keys", organization.list_keys),
    web.delete("/v1/organization/keys/{key_id}", organization.revoke_api_key),
    web.get("/v1/organization/overview", overview.system_overview),
    web.post("/v1/provider/worker_keys", organization.create_worker_key),
    web.get("/v1/provider/worker_keys", organization.list_worker_keys),
    web.delete("/v1/provider/worker_keys/{key_id}", organization.revoke_worker_key),
    web.post("/v1/provider/providers", provider.register_provider),
    web.get("/v1/provider/providers", provider.list_providers),
    web.get("/v1/provider/providers/{provider_id}", provider.retrieve_provider),
    web.post("/v1/provider/providers/{provider_id}/worker_keys", provider.create_provider_worker_key),
    web.get("/v1/provider/providers/{provider_id}/worker_keys", provider.list_provider_worker_keys),
    web.delete("/v1/provider/providers/{provider_id}/worker_keys/{key_id}", provider.revoke_provider_worker_key),
    web.get("/v1/provider/executors", provider.list_executors),
    web.get("/v1/admin/anomalies", anomalies.list_anomalies),
]
