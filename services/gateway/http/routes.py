"""The route table: each row is a route and its description (request and response models, parameters, who may
call); `/openapi.json` is generated from it."""

from aiohttp import web

from contracts.api.anomaly import Anomaly
from contracts.api.batch import Batch
from contracts.api.batch_event import BatchStreamEvent
from contracts.api.batch_request import BatchCreateRequest
from contracts.api.billing import BatchQuote, BillingBalance, Grant, GrantCredits, QuoteRequest
from contracts.api.error_codes import BatchErrorSummary
from contracts.api.file import FileDeleted, FileObject
from contracts.api.model import MAX_MODEL_NAME, Model
from contracts.api.organization import (
    USER_ID_PATTERN,
    ApiKey,
    CreateKey,
    CreateOrganization,
    CreateUser,
    CreateWorkerKey,
    DeletedApiKey,
    Me,
    ModelAlias,
    Organization,
    User,
)
from contracts.api.page import ListPage
from contracts.api.provider import ApproveProvider, Provider, ProviderConnection, ProviderExecutor, RegisterProvider
from contracts.api.webhook import CreateWebhook, DeletedWebhook, UpdateWebhook, WebhookDelivery, WebhookEndpoint
from contracts.lifecycle import ALL_STATUSES
from services.gateway.http.observe import metrics_view
from services.gateway.http.openapi import AFTER, FILES_LIMIT, LIMIT, Answer, openapi_view, query, route
from services.gateway.http.readiness import readyz
from services.gateway.usecases.retry import RetryRequest
from services.gateway.views import (
    asyncapi,
    batches,
    billing,
    connection,
    errors,
    events,
    files,
    keys,
    models,
    organization,
    overview,
    provider,
    results,
    webhooks,
)


async def healthz(request: web.Request) -> web.Response:
    """Liveness: the process answers; no I/O (a broker or S3 outage is `/readyz`'s, and no reason to restart)."""
    return web.json_response({"status": "ok"})


UPLOAD = {"multipart/form-data": {"schema": {
    "type": "object", "required": ["purpose", "file"],
    "properties": {"purpose": {"type": "string", "enum": ["batch"]},
                   "file": {"type": "string", "format": "binary"}}}}}
UPLOAD_MODEL_NAME = {"type": "string", "minLength": 1, "maxLength": MAX_MODEL_NAME}
UPLOAD_MODEL = ({"name": files.UPLOAD_MODEL_HEADER, "in": "header", "required": False,
                 "description": "The model of the file's lines that name none (LiteLLM's header)",
                 "schema": UPLOAD_MODEL_NAME}, query("model", UPLOAD_MODEL_NAME))
IDEMPOTENCY_KEY = {"name": "Idempotency-Key", "in": "header", "required": False,
                   "schema": {"type": "string", "pattern": r"^[!-~][ -~]{14,78}[!-~]$"}}
"""16 to 80 printable ASCII characters (a header's own spaces at either end are not part of its value)."""
EVENTS = Answer("The batch's facts as Server-Sent Events: `id:` is the stream sequence, `event:` the type, `data:` "
                "one BatchStreamEvent (schema in components); resume with Last-Event-ID; the stream ends after the "
                "batch's terminal event", "text/event-stream", event_data=BatchStreamEvent)
CONTENT = Answer("The file's bytes; headers X-Sheshnag-Content-SHA256 and Content-Disposition (an attachment named "
                 "as the file; RFC 6266 filename* for a name that is not plain ASCII)", "application/octet-stream",
                 {"type": "string", "format": "binary"})
METRICS = Answer("Prometheus metrics", "text/plain")
READY = Answer("Whether the gateway reaches the broker and the object store now (a cheap call to each, 2 s at most): "
               "`status` ready (200) or unavailable (503, the same body), and each one's check", "application/json",
               {"type": "object", "required": ["status", "checks"], "properties": {
                   "status": {"type": "string", "enum": ["ready", "unavailable"]},
                   "checks": {"type": "object", "properties": {
                       name: {"type": "string", "enum": ["ok", "disconnected", "timeout", "error", "bucket missing"]}
                       for name in ("nats", "s3")}}}})
OVERVIEW = Answer("Executors, batches per status, the queue, running batches, consumer lag", "application/json",
                  {"type": "object"})
WORKER_KEYS = "/v1/provider/providers/{provider_id}/worker_keys"

NOT_PAID = ("402", "The organisation's credit does not cover the batch's worst case (insufficient_balance), or a "
                   "price is above its metadata.max_price_usd (price_above_max): deployments that bill")
SLOW_UPLOAD = ("408", "The upload's body came too slowly (request_timeout)")

ROUTES = [
    route("GET", "/healthz", healthz, "healthz", "Liveness", access="public"),
    route("GET", "/readyz", readyz, "readyz", "Readiness: the broker and the object store answer", READY,
          access="public", unavailable="Not ready: the broker or the object store does not answer"),
    route("GET", "/metrics", metrics_view, "metrics", "Prometheus metrics (admin keys; the fleet-wide gauges as "
          "last refreshed)", METRICS, access="admin", refusal="Only an admin key may read the metrics."),
    route("GET", "/asyncapi.json", asyncapi.asyncapi_json, "asyncapi", "The event catalogue: every fact, its schema, "
          "who emits and consumes it", Answer("AsyncAPI 3.0", "application/json", {"type": "object"}), access="public"),
    route("GET", "/v1/models", models.list_models, "listModels", "The catalogue", ListPage[Model]),
    route("GET", "/v1/models/aliases", models.list_aliases, "listModelAliases",
          "Aliases of the models the key may use", ListPage[ModelAlias]),
    route("GET", "/v1/models/{model_id}", models.retrieve_model, "retrieveModel", "One model or alias", Model),
    route("POST", "/v1/files", files.create_file, "createFile", "Upload a JSONL file (deduplicated by content)",
          FileObject, body=UPLOAD, params=UPLOAD_MODEL, errors=(SLOW_UPLOAD,)),
    route("GET", "/v1/files", files.list_files, "listFiles", "The caller's files (any key of the same user)",
          ListPage[FileObject], params=(AFTER, FILES_LIMIT, query("order", {"type": "string", "enum": ["asc", "desc"]}),
                                        query("purpose", {"type": "string", "enum": files.LISTED_PURPOSES}))),
    route("GET", "/v1/files/{file_id}", files.retrieve_file, "retrieveFile", "One file", FileObject),
    route("GET", "/v1/files/{file_id}/content", files.file_content, "downloadFile", "The file's content", CONTENT),
    route("DELETE", "/v1/files/{file_id}", files.delete_file, "deleteFile",
          "Delete a file (409 while a live batch reads it)", FileDeleted),
    route("POST", "/v1/batches", batches.create_batch, "createBatch", "Create a batch", Batch,
          body=BatchCreateRequest, params=(IDEMPOTENCY_KEY,), errors=(NOT_PAID,)),
    route("POST", "/v1/batches/quote", billing.quote_batch, "quoteBatch",
          "What a batch on an uploaded file would cost (min, estimate, worst case: what a create reserves), its "
          "token bounds and the queue's ETA; nothing is reserved (extension)", BatchQuote, body=QuoteRequest),
    route("GET", "/v1/billing/balance", billing.get_balance, "getBillingBalance",
          "The caller's organisation's credit and its last movement (an admin key: any, with organization_id)",
          BillingBalance, params=(query("organization_id", {"type": "string", "pattern": USER_ID_PATTERN}),)),
    route("GET", "/v1/billing/accounts", billing.list_accounts, "listBillingAccounts",
          "Every organisation's credit (operators)", ListPage[BillingBalance], access="admin"),
    route("POST", "/v1/billing/grants", billing.grant_credits, "grantCredits",
          "Credit an organisation (a negative amount takes credit back)", Grant, body=GrantCredits, access="admin"),
    route("GET", "/v1/batches", batches.list_batches, "listBatches",
          "The caller's batches, newest first; an organisation's administrator its members' (scope=organization), "
          "an admin key every batch (scope=all)", ListPage[Batch],
          params=(AFTER, LIMIT, query("scope", {"type": "string", "enum": ["own", "organization", "all"]}),
                  query("organization_id", {"type": "string"}),
                  query("status", {"type": "string", "enum": sorted(ALL_STATUSES)}),
                  query("search", {"type": "string", "maxLength": batches.MAX_SEARCH}))),
    route("GET", "/v1/batches/{batch_id:(?!quote$)[^/]+}", batches.retrieve_batch, "retrieveBatch",
          "One batch (its owner's, or an administrator's of the owner's organisation or of the platform)", Batch),
    route("POST", "/v1/batches/{batch_id}/cancel", batches.cancel_batch, "cancelBatch",
          "Cancel a batch; an administrator's cancel of a member's batch adds cancelled_by_org_admin or "
          "cancelled_by_platform_admin to its errors.data", Batch),
    route("GET", "/v1/batches/{batch_id}/results", results.batch_results, "batchResults",
          "The output lines committed so far, while the batch runs, paged (after = the last page's next_after); "
          "complete once the batch ended and the last line was given (extension)", results.ResultsPage,
          params=(query("after", {"type": "string", "pattern": results.CURSOR_PATTERN}),
                  query("limit", {"type": "integer", "minimum": 1, "maximum": results.MAX_LIMIT}))),
    route("POST", "/v1/batches/{batch_id}/retry", batches.retry_batch, "retryBatch",
          "A new batch of the lines that failed in an ended one (run-time failures and lines never run; `codes` to "
          "choose), linked by metadata.retry_of (extension)", Batch, body=RetryRequest, errors=(NOT_PAID,)),
    route("POST", "/v1/batches/{batch_id}/release", batches.release_batch, "releaseBatch",
          "Run a batch created with hold (extension)", Batch),
    route("GET", "/v1/batches/{batch_id}/events", events.stream_batch_events, "batchEvents",
          "The batch's events (SSE)", EVENTS),
    route("GET", "/v1/batches/{batch_id}/errors", errors.batch_errors, "batchErrors",
          "Errors grouped by code, with fixes", BatchErrorSummary),
    route("POST", "/v1/webhooks", webhooks.create_webhook, "createWebhook",
          "Register a webhook endpoint for batch events (Standard Webhooks signing); the secret is in this answer "
          "only (extension)", WebhookEndpoint, body=CreateWebhook),
    route("GET", "/v1/webhooks", webhooks.list_webhooks, "listWebhooks",
          "The webhook endpoints the caller manages (extension)", ListPage[WebhookEndpoint]),
    route("GET", "/v1/webhooks/{webhook_id}", webhooks.retrieve_webhook, "retrieveWebhook",
          "One webhook endpoint (extension)", WebhookEndpoint),
    route("POST", "/v1/webhooks/{webhook_id}", webhooks.update_webhook, "updateWebhook",
          "Change a webhook endpoint's url, events, description, or enable or disable it (extension)",
          WebhookEndpoint, body=UpdateWebhook),
    route("DELETE", "/v1/webhooks/{webhook_id}", webhooks.delete_webhook, "deleteWebhook",
          "Delete a webhook endpoint; its pending deliveries end failed (extension)", DeletedWebhook),
    route("POST", "/v1/webhooks/{webhook_id}/rotate_secret", webhooks.rotate_secret, "rotateWebhookSecret",
          "A new signing secret for the endpoint, shown in this answer only (extension)", WebhookEndpoint),
    route("GET", "/v1/webhooks/{webhook_id}/deliveries", webhooks.list_deliveries, "listWebhookDeliveries",
          "The endpoint's deliveries, newest first, with every attempt (extension)", ListPage[WebhookDelivery],
          params=(query("status", {"type": "string", "enum": ["pending", "delivered", "failed"]}),
                  query("limit", {"type": "integer", "minimum": 1, "maximum": webhooks.MAX_DELIVERIES_LISTED}))),
    route("POST", "/v1/webhooks/{webhook_id}/deliveries/{delivery_id}/redeliver", webhooks.redeliver,
          "redeliverWebhook", "Send a delivery again now, with the same webhook-id (extension)", WebhookDelivery),
    route("GET", "/v1/me", keys.who_am_i, "whoAmI",
          "The calling key: its role, user and organisation (extension)", Me),
    route("POST", "/v1/organization/users", organization.create_user, "createUser",
          "Create a user, optionally limited to some models, in an organisation", User, body=CreateUser,
          access="admin"),
    route("GET", "/v1/organization/users", organization.list_users, "listUsers", "Every user, or one organisation's",
          ListPage[User], params=(query("organization_id", {"type": "string"}),), access="admin"),
    route("POST", "/v1/organization/organizations", organization.create_organization, "createOrganization",
          "Create an organisation", Organization, body=CreateOrganization, access="admin"),
    route("GET", "/v1/organization/organizations", organization.list_organizations, "listOrganizations",
          "Every organisation, the default one first", ListPage[Organization], access="admin"),
    route("GET", "/v1/organization/organizations/{organization_id}", organization.retrieve_organization,
          "retrieveOrganization", "One organisation", Organization, access="admin"),
    route("POST", "/v1/organization/keys", keys.create_key, "createKey",
          "Create a key (an admin: any user's or an admin key; a user: one of their own); the raw value is in this "
          "answer only", ApiKey, body=CreateKey, access="self"),
    route("GET", "/v1/organization/keys", keys.list_keys, "listKeys",
          "Keys without values: an admin sees every user and admin key, a user their own", ListPage[ApiKey],
          access="self"),
    route("DELETE", "/v1/organization/keys/{key_id}", keys.revoke_api_key, "revokeKey",
          "Revoke a key (an admin: any; a user: their own); its live batches stop with authorization_revoked",
          DeletedApiKey, access="self"),
    route("GET", "/v1/organization/overview", overview.system_overview, "systemOverview",
          "Admin, read-only: executors, batches per status, the queue with why each waits, running batches, "
          "consumer lag", OVERVIEW, access="admin"),
    route("POST", "/v1/provider/worker_keys", keys.create_worker_key, "createWorkerKey",
          "Create an executor's key (wk-…); shown once", ApiKey, body=CreateWorkerKey, access="admin"),
    route("GET", "/v1/provider/worker_keys", keys.list_worker_keys, "listWorkerKeys",
          "Every worker key, without values", ListPage[ApiKey], access="admin"),
    route("DELETE", "/v1/provider/worker_keys/{key_id}", keys.revoke_worker_key, "revokeWorkerKey",
          "Revoke a worker key", DeletedApiKey, access="admin"),
    route("GET", "/v1/provider/connection", connection.provider_connection, "providerConnection",
          "Public: the broker URLs a provider host's executor connects to with its worker key, and the CA of the "
          "broker's certificate (`sheshnag executor --deployment URL --worker-key wk-…` reads it)",
          ProviderConnection, access="public"),
    route("POST", "/v1/provider/providers", provider.register_provider, "registerProvider",
          "Register a provider owned by the caller's user (or key)", Provider, body=RegisterProvider),
    route("GET", "/v1/provider/providers", provider.list_providers, "listProviders",
          "The providers the caller manages (admins: all)", ListPage[Provider]),
    route("GET", "/v1/provider/providers/{provider_id}", provider.retrieve_provider, "retrieveProvider",
          "One provider the caller manages", Provider),
    route("POST", "/v1/provider/providers/{provider_id}/approve", provider.approve_provider, "approveProvider",
          "Approve a provider: a platform admin for every organisation (or the one named), an organisation's "
          "administrator for their own organisation's batches", Provider, body=ApproveProvider),
    route("POST", "/v1/provider/providers/{provider_id}/unapprove", provider.unapprove_provider, "unapproveProvider",
          "Withdraw an approval (same scopes as approving)", Provider, body=ApproveProvider),
    route("POST", WORKER_KEYS, keys.create_provider_worker_key, "createProviderWorkerKey",
          "Create a worker key (wk-…) of the provider; shown once", ApiKey, body=CreateWorkerKey),
    route("GET", WORKER_KEYS, keys.list_provider_worker_keys, "listProviderWorkerKeys",
          "The provider's worker keys, without values", ListPage[ApiKey]),
    route("DELETE", WORKER_KEYS + "/{key_id}", keys.revoke_provider_worker_key, "revokeProviderWorkerKey",
          "Revoke one of the provider's worker keys", DeletedApiKey),
    route("GET", "/v1/provider/executors", provider.list_executors, "listProviderExecutors",
          "Executors that joined with a worker key of the caller's providers (admins: every executor): models, "
          "memory, health, lines served", ListPage[ProviderExecutor],
          params=(query("provider_id", {"type": "string"}),)),
    route("GET", "/v1/admin/anomalies", overview.list_anomalies, "listAnomalies",
          "Admin: facts the ledger refused (illegal transitions), newest first", ListPage[Anomaly], access="admin"),
]
ROUTES.append(route("GET", "/openapi.json", openapi_view(ROUTES), "openapi", "This document", access="public"))
