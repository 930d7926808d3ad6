"""`GET /openapi.json`: every route of the gateway, with schemas generated from the pydantic contracts."""

from typing import Any

from aiohttp import web
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from contracts.api.anomaly import Anomaly
from contracts.api.batch import Batch
from contracts.api.batch_event import BatchStreamEvent
from contracts.api.batch_request import BatchCreateRequest
from contracts.api.error import ErrorResponse
from contracts.api.error_codes import BatchErrorSummary
from contracts.api.file import FileDeleted, FileObject
from contracts.api.model import Model
from contracts.api.organization import (
    ApiKey,
    CreateKey,
    CreateOrganization,
    CreateUser,
    CreateWorkerKey,
    DeletedApiKey,
    ModelAlias,
    Organization,
    User,
)
from contracts.api.page import ListPage
from contracts.api.provider import Provider, ProviderExecutor, RegisterProvider

JsonObject = dict[str, Any]
MODELS: list[type[BaseModel]] = [Batch, BatchCreateRequest, BatchErrorSummary, ErrorResponse, FileDeleted,
                                 FileObject, Model, ListPage[Batch], ListPage[FileObject], ListPage[Model]]
MODELS += [ApiKey, CreateKey, CreateOrganization, CreateUser, CreateWorkerKey, DeletedApiKey, ModelAlias,
           Organization, User, ListPage[ApiKey], ListPage[ModelAlias], ListPage[Organization], ListPage[User]]
MODELS += [Provider, ProviderExecutor, RegisterProvider, Anomaly, ListPage[Provider], ListPage[ProviderExecutor],
           ListPage[Anomaly], BatchStreamEvent]


def _schemas() -> tuple[dict[type[BaseModel], JsonObject], JsonObject]:
    refs, schemas = models_json_schema([(m, "serialization") for m in MODELS],
                                       ref_template="#/components/schemas/{model}")
    return {model: dict(ref) for (model, _), ref in refs.items()}, schemas.get("$defs", {})  # type: ignore[misc]


REFS, COMPONENTS = _schemas()


def _ref(model: type[BaseModel]) -> JsonObject:
    return REFS[model]


def _json(model: type[BaseModel], description: str = "OK") -> JsonObject:
    return {"description": description, "content": {"application/json": {"schema": _ref(model)}}}


def _path_id(name: str) -> JsonObject:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


def _query(name: str, schema: JsonObject) -> JsonObject:
    return {"name": name, "in": "query", "required": False, "schema": schema}


LIMIT = _query("limit", {"type": "integer", "minimum": 1, "maximum": 100})
FILES_LIMIT = _query("limit", {"type": "integer", "minimum": 1, "maximum": 10_000, "default": 10_000})
AFTER = _query("after", {"type": "string"})
ERRORS = {"400": _json(ErrorResponse, "Invalid request"), "401": _json(ErrorResponse, "Missing or bad key"),
          "404": _json(ErrorResponse, "Not found (or not yours)"), "409": _json(ErrorResponse, "Conflict"),
          "413": _json(ErrorResponse, "Too large"), "429": _json(ErrorResponse, "Rate limited")}


def _op(op_id: str, summary: str, ok: JsonObject, params: list[JsonObject] | None = None,
        body: JsonObject | None = None, public: bool = False) -> JsonObject:
    operation: JsonObject = {"operationId": op_id, "summary": summary, "parameters": params or [],
                             "responses": {"200": ok, **({} if public else ERRORS)}}
    if body is not None:
        operation["requestBody"] = {"required": True, "content": body}
    if public:
        operation["security"] = []
    return operation


def _admin(operation: JsonObject) -> JsonObject:
    """An admin route: a user key gets 403."""
    operation["responses"]["403"] = _json(ErrorResponse, "Not an admin key")
    return operation


def _body_of(model: type[BaseModel]) -> JsonObject:
    return {"application/json": {"schema": _ref(model)}}


def _admin_paths() -> JsonObject:
    """Organisations, users, keys and worker keys: admin keys only."""
    key_id, organization_id = _path_id("key_id"), _path_id("organization_id")
    return {
        "/v1/organization/organizations": {
            "post": _admin(_op("createOrganization", "Create an organisation", _json(Organization),
                               body=_body_of(CreateOrganization))),
            "get": _admin(_op("listOrganizations", "Every organisation, the default one first",
                              _json(ListPage[Organization]))),
        },
        "/v1/organization/organizations/{organization_id}": {"get": _admin(_op(
            "retrieveOrganization", "One organisation", _json(Organization), [organization_id]))},
        "/v1/organization/users": {
            "post": _admin(_op("createUser", "Create a user, optionally limited to some models, in an organisation",
                               _json(User), body=_body_of(CreateUser))),
            "get": _admin(_op("listUsers", "Every user, or one organisation's", _json(ListPage[User]),
                              [_query("organization_id", {"type": "string"})])),
        },
        "/v1/organization/keys": {
            "post": _admin(_op("createKey", "Create a user or admin key; the raw value is in this answer only",
                               _json(ApiKey), body=_body_of(CreateKey))),
            "get": _admin(_op("listKeys", "Every user and admin key, without values", _json(ListPage[ApiKey]))),
        },
        "/v1/organization/keys/{key_id}": {"delete": _admin(_op(
            "revokeKey", "Revoke a key; its live batches stop with authorization_revoked", _json(DeletedApiKey),
            [key_id]))},
        "/v1/provider/worker_keys": {
            "post": _admin(_op("createWorkerKey", "Create an executor's key (wk-…); shown once", _json(ApiKey),
                               body=_body_of(CreateWorkerKey))),
            "get": _admin(_op("listWorkerKeys", "Every worker key, without values", _json(ListPage[ApiKey]))),
        },
        "/v1/provider/worker_keys/{key_id}": {"delete": _admin(_op(
            "revokeWorkerKey", "Revoke a worker key", _json(DeletedApiKey), [key_id]))},
    }


def _provider_paths() -> JsonObject:
    """The provider portal (any user or admin key; another's provider is 404) and the ledger's anomalies (admin)."""
    provider_id, key_id = _path_id("provider_id"), _path_id("key_id")
    keys = "/v1/provider/providers/{provider_id}/worker_keys"
    return {
        "/v1/provider/providers": {
            "post": _op("registerProvider", "Register a provider owned by the caller's user (or key)",
                        _json(Provider), body=_body_of(RegisterProvider)),
            "get": _op("listProviders", "The providers the caller manages (admins: all)", _json(ListPage[Provider])),
        },
        "/v1/provider/providers/{provider_id}": {"get": _op("retrieveProvider", "One provider the caller manages",
                                                            _json(Provider), [provider_id])},
        keys: {
            "post": _op("createProviderWorkerKey", "Create a worker key (wk-…) of the provider; shown once",
                        _json(ApiKey), [provider_id], body=_body_of(CreateWorkerKey)),
            "get": _op("listProviderWorkerKeys", "The provider's worker keys, without values", _json(ListPage[ApiKey]),
                       [provider_id]),
        },
        keys + "/{key_id}": {"delete": _op("revokeProviderWorkerKey", "Revoke one of the provider's worker keys",
                                           _json(DeletedApiKey), [provider_id, key_id])},
        "/v1/provider/executors": {"get": _op(
            "listProviderExecutors", "Executors that joined with a worker key of the caller's providers (admins: "
            "every executor): models, memory, health, lines served", _json(ListPage[ProviderExecutor]),
            [_query("provider_id", {"type": "string"})])},
        "/v1/admin/anomalies": {"get": _admin(_op(
            "listAnomalies", "Admin: facts the ledger refused (illegal transitions), newest first",
            _json(ListPage[Anomaly])))},
    }


UPLOAD = {"multipart/form-data": {"schema": {
    "type": "object", "required": ["purpose", "file"],
    "properties": {"purpose": {"type": "string", "enum": ["batch"]},
                   "file": {"type": "string", "format": "binary"}}}}}
EVENTS = {"description": "The batch's facts as Server-Sent Events: `id:` is the stream sequence, `event:` the type, "
                         "`data:` one BatchStreamEvent (schema in components); resume with Last-Event-ID; the stream "
                         "ends after the batch's terminal event", "content": {"text/event-stream": {
                             "schema": {"type": "string"}, "x-sheshnag-event-data": _ref(BatchStreamEvent)}}}
CONTENT = {"description": "The file's bytes; header X-Sheshnag-Content-SHA256",
           "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}


def _paths() -> JsonObject:
    file_id, batch_id = _path_id("file_id"), _path_id("batch_id")
    return {
        "/healthz": {"get": _op("healthz", "Liveness", {"description": "OK"}, public=True)},
        "/openapi.json": {"get": _op("openapi", "This document", {"description": "OK"}, public=True)},
        "/v1/models": {"get": _op("listModels", "The catalogue", _json(ListPage[Model]))},
        "/v1/models/aliases": {"get": _op("listModelAliases", "Aliases of the models the key may use",
                                          _json(ListPage[ModelAlias]))},
        "/metrics": {"get": _op("metrics", "Prometheus metrics", {"description": "OK", "content": {
            "text/plain": {"schema": {"type": "string"}}}}, public=True)},
        **_admin_paths(),
        **_provider_paths(),
        "/v1/models/{model_id}": {"get": _op("retrieveModel", "One model or alias", _json(Model),
                                             [_path_id("model_id")])},
        "/v1/files": {
            "post": _op("createFile", "Upload a JSONL file (deduplicated by content)", _json(FileObject),
                        body=UPLOAD),
            "get": _op("listFiles", "The caller's files (any key of the same user)", _json(ListPage[FileObject]),
                       [AFTER, FILES_LIMIT, _query("order", {"type": "string", "enum": ["asc", "desc"]}),
                        _query("purpose", {"type": "string"})]),
        },
        "/v1/files/{file_id}": {
            "get": _op("retrieveFile", "One file", _json(FileObject), [file_id]),
            "delete": _op("deleteFile", "Delete a file (409 while a live batch reads it)", _json(FileDeleted),
                          [file_id]),
        },
        "/v1/files/{file_id}/content": {"get": _op("downloadFile", "The file's content", CONTENT, [file_id])},
        "/v1/batches": {
            "post": _op("createBatch", "Create a batch", _json(Batch),
                        [{"name": "Idempotency-Key", "in": "header", "required": False,
                          "schema": {"type": "string", "minLength": 16, "maxLength": 80}}],
                        body={"application/json": {"schema": _ref(BatchCreateRequest)}}),
            "get": _op("listBatches", "The caller's batches, newest first", _json(ListPage[Batch]), [AFTER, LIMIT]),
        },
        "/v1/batches/{batch_id}": {"get": _op("retrieveBatch", "One batch", _json(Batch), [batch_id])},
        "/v1/batches/{batch_id}/cancel": {"post": _op("cancelBatch", "Cancel a batch", _json(Batch), [batch_id])},
        "/v1/batches/{batch_id}/release": {"post": _op("releaseBatch", "Run a batch created with hold (extension)",
                                                       _json(Batch), [batch_id])},
        "/v1/batches/{batch_id}/events": {"get": _op("batchEvents", "The batch's events (SSE)", EVENTS, [batch_id])},
        "/v1/batches/{batch_id}/errors": {"get": _op("batchErrors", "Errors grouped by code, with fixes",
                                                     _json(BatchErrorSummary), [batch_id])},
        "/v1/organization/overview": {"get": _admin(_op(
            "systemOverview", "Admin, read-only: executors, batches per status, the queue with why each waits, "
            "running batches, consumer lag", {"description": "OK", "content": {"application/json": {
                "schema": {"type": "object"}}}}))},
    }


def _undescribed(paths: JsonObject, routes: list[tuple[str, str]]) -> JsonObject:
    """Routes added without a description here still appear, with their path parameters and error shape."""
    for method, path in routes:
        if method.lower() in paths.get(path, {}) or method == "HEAD":
            continue
        params = [_path_id(part[1:-1]) for part in path.split("/") if part.startswith("{")]
        op_id = method.lower() + "".join(p.strip("{}").title() for p in path.split("/") if p).replace("_", "")
        paths.setdefault(path, {})[method.lower()] = _op(op_id, f"{method} {path}", {"description": "OK"},
                                                           params, public=not path.startswith("/v1/"))
    return paths


def build_openapi(routes: list[tuple[str, str]] | None = None) -> JsonObject:
    """The document; `routes` (method, path) are the app's, so none goes undescribed."""
    return {
        "openapi": "3.1.0",
        "info": {"title": "Sheshnag", "version": "1", "description": "OpenAI-compatible Batch API."},
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "paths": _undescribed(_paths(), routes or []),
        "components": {"schemas": COMPONENTS,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }


async def openapi_json(request: web.Request) -> web.Response:
    routes = [(route.method, route.resource.canonical) for route in request.app.router.routes()
              if route.resource is not None]
    return web.json_response(build_openapi(routes))
