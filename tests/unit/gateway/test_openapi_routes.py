"""`/openapi.json` is generated from the route table: every route of the app is in it, described, with its request
and response models, and the document is a valid OpenAPI 3.1 document."""

import json
import re

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from aiohttp.web_routedef import RouteDef
from openapi_spec_validator import validate

from contracts.api.batch_request import BatchCreateRequest
from contracts.api.organization import CreateUser, User
from contracts.events.key import KeyRole
from contracts.readmodel import ApiKeyRecord
from services.gateway.app import create_app
from services.gateway.dashboard.pages import PREFIX as DASHBOARD
from services.gateway.http.auth import REQUEST_PRINCIPAL
from services.gateway.http.openapi import JsonObject, Route, build_openapi, route
from services.gateway.http.routes import ROUTES, healthz
from services.gateway.settings import GatewaySettings
from services.gateway.usecases.batches import completion_window_seconds
from services.gateway.usecases.refusals import ApiError

DOCUMENT = build_openapi(ROUTES)


def app_routes() -> set[tuple[str, str]]:
    """(method, path) of every route but HEAD twins and the dashboard's HTML pages and static files."""
    app = create_app(GatewaySettings())
    return {(route.method.lower(), route.resource.canonical) for route in app.router.routes()
            if route.resource is not None and route.method != "HEAD"
            and not route.resource.canonical.startswith(DASHBOARD)}


def test_every_route_of_the_app_is_in_the_document() -> None:
    paths = DOCUMENT["paths"]
    missing = sorted(f"{method.upper()} {path}" for method, path in app_routes() if method not in paths.get(path, {}))
    assert missing == []


def test_the_document_describes_no_route_the_app_lacks() -> None:
    described = {(method, path) for path, operations in DOCUMENT["paths"].items() for method in operations}
    assert sorted(described - app_routes()) == []


def test_every_row_of_the_route_table_is_described_not_guessed() -> None:
    assert [f"{r.method} {r.path}" for r in ROUTES if not isinstance(r, Route)] == []


async def test_the_served_document_is_valid_openapi() -> None:
    view = next(r.handler for r in ROUTES if isinstance(r, Route) and r.path == "/openapi.json")
    served = await view(make_mocked_request("GET", "/openapi.json"))
    assert isinstance(served, web.Response) and served.content_type == "application/json"
    validate(json.loads(served.text or ""))


def component(ref: JsonObject) -> JsonObject:
    return dict(DOCUMENT["components"]["schemas"][ref["$ref"].rsplit("/", 1)[1]])


def test_a_request_body_and_an_answer_are_their_contract_models() -> None:
    create = DOCUMENT["paths"]["/v1/batches"]["post"]
    body = component(create["requestBody"]["content"]["application/json"]["schema"])
    assert set(body["properties"]) == set(BatchCreateRequest.model_fields)
    assert body["required"] == ["input_file_id", "endpoint", "completion_window"]
    assert body["additionalProperties"] is False  # an unknown parameter is refused, as the view does
    user = DOCUMENT["paths"]["/v1/organization/users"]["post"]
    assert set(component(user["requestBody"]["content"]["application/json"]["schema"])["properties"]) == set(
        CreateUser.model_fields)
    assert set(component(user["responses"]["200"]["content"]["application/json"]["schema"])["properties"]) == set(
        User.model_fields)


def test_a_body_every_field_of_which_has_a_default_may_be_left_out_and_others_may_not() -> None:
    paths = DOCUMENT["paths"]
    optional = [paths["/v1/organization/keys"]["post"], paths["/v1/organization/organizations"]["post"],
                paths["/v1/provider/providers/{provider_id}/approve"]["post"]]
    assert [operation["requestBody"]["required"] for operation in optional] == [False] * 3
    assert paths["/v1/batches"]["post"]["requestBody"]["required"] is True
    assert paths["/v1/files"]["post"]["requestBody"]["required"] is True  # the upload


def test_the_documented_completion_windows_are_exactly_those_a_default_deployment_takes() -> None:
    body = component(DOCUMENT["paths"]["/v1/batches"]["post"]["requestBody"]["content"]["application/json"]["schema"])
    window = body["properties"]["completion_window"]
    seconds = [*range(0, 700_000, 997), *range(86_300, 86_500), *range(604_700, 604_900)]
    for value in [f"{n}h" for n in range(200)] + [f"{n}m" for n in range(11_000)] + [f"{n}s" for n in seconds] + [
            "024h", "0000000024h", "168h ", "1d"]:
        documented = re.fullmatch(window["pattern"], value) is not None and any(
            re.fullmatch(choice["pattern"], value) for choice in window["anyOf"])
        try:
            taken = completion_window_seconds(value, 24 * 3600) > 0
        except ApiError:
            taken = False
        assert documented == taken, value


def test_a_grant_of_zero_and_an_empty_cursor_are_documented_as_refused() -> None:
    grant = component(DOCUMENT["paths"]["/v1/billing/grants"]["post"]["requestBody"]["content"]["application/json"][
        "schema"])["properties"]["amount_usd"]
    zero = re.compile(grant["not"]["pattern"])
    assert [bool(zero.fullmatch(amount)) for amount in ("0", "-0.000", "00.0", "0.01", "-5", "10")] == [
        True, True, True, False, False, False]
    for path in ("/v1/batches", "/v1/files"):
        after = next(p for p in DOCUMENT["paths"][path]["get"]["parameters"] if p["name"] == "after")
        assert after["schema"]["minLength"] == 1


def test_a_create_links_to_the_operations_on_what_it_made_by_the_id_it_answers() -> None:
    links = DOCUMENT["paths"]["/v1/files"]["post"]["responses"]["200"]["links"]
    assert set(links) == {"retrieveFile", "downloadFile", "deleteFile"}
    assert links["retrieveFile"] == {"operationId": "retrieveFile", "parameters": {"file_id": "$response.body#/id"}}
    batch_links = DOCUMENT["paths"]["/v1/batches"]["post"]["responses"]["200"]["links"]
    assert {"retrieveBatch", "cancelBatch"} <= set(batch_links)
    assert "batchEvents" not in batch_links  # a stream that lasts as long as the batch is no step to take blindly
    assert "links" not in DOCUMENT["paths"]["/v1/batches/quote"]["post"]["responses"]["200"]  # it makes nothing


def test_admin_routes_say_a_user_key_gets_403() -> None:
    paths = DOCUMENT["paths"]
    for path in ("/v1/organization/organizations", "/v1/organization/users", "/v1/organization/keys"):
        for operation in paths[path].values():
            assert operation["responses"]["403"]["content"]["application/json"]["schema"] == {
                "$ref": "#/components/schemas/ErrorResponse"}


def test_public_routes_need_no_key_and_others_say_what_a_refusal_looks_like() -> None:
    health = DOCUMENT["paths"]["/healthz"]["get"]
    assert health["security"] == [] and set(health["responses"]) == {"200"}
    listed = DOCUMENT["paths"]["/v1/batches"]["get"]
    assert "security" not in listed and {"400", "401", "403", "404", "429"} <= set(listed["responses"])
    assert [p["name"] for p in DOCUMENT["paths"]["/v1/batches/{batch_id}"]["get"]["parameters"]] == ["batch_id"]


def test_readiness_is_public_and_documents_its_503_with_the_same_body() -> None:
    ready = DOCUMENT["paths"]["/readyz"]["get"]
    assert ready["security"] == [] and set(ready["responses"]) == {"200", "503"}
    assert ready["responses"]["503"]["content"] == ready["responses"]["200"]["content"]


def test_every_operation_has_a_unique_id() -> None:
    ids = [op["operationId"] for operations in DOCUMENT["paths"].values() for op in operations.values()]
    assert len(ids) == len(set(ids))


def test_a_row_written_as_a_plain_aiohttp_route_still_appears_with_a_unique_id() -> None:
    table = [route("GET", "/healthz", healthz, "healthz", "Liveness", access="public"),
             RouteDef("GET", "/v1/things/{thing_id}", healthz, {}), RouteDef("GET", "/things", healthz, {})]
    paths = build_openapi(table)["paths"]
    guessed = paths["/v1/things/{thing_id}"]["get"]
    assert guessed["operationId"] == "getV1ThingsThingId" and "security" not in guessed
    assert paths["/things"]["get"]["security"] == []


MANAGE = "Only an admin key may manage users and keys."
ADMIN_ONLY = {
    ("GET", "/metrics"): "Only an admin key may read the metrics.",
    ("GET", "/v1/billing/accounts"): MANAGE,
    ("POST", "/v1/billing/grants"): MANAGE,
    ("POST", "/v1/organization/users"): MANAGE,
    ("GET", "/v1/organization/users"): MANAGE,
    ("POST", "/v1/organization/organizations"): MANAGE,
    ("GET", "/v1/organization/organizations"): MANAGE,
    ("GET", "/v1/organization/organizations/{organization_id}"): MANAGE,
    ("GET", "/v1/organization/overview"): MANAGE,
    ("POST", "/v1/provider/worker_keys"): MANAGE,
    ("GET", "/v1/provider/worker_keys"): MANAGE,
    ("DELETE", "/v1/provider/worker_keys/{key_id}"): MANAGE,
    ("GET", "/v1/admin/anomalies"): MANAGE,
}
"""Every admin-only route, with what any other key is told."""


@pytest.mark.parametrize("role", ["user", "worker"])
async def test_an_admin_route_refuses_every_other_key_before_its_view(role: KeyRole) -> None:
    rows = {(r.method, r.path): r for r in ROUTES if isinstance(r, Route) and r.operation.access == "admin"}
    assert sorted(rows) == sorted(ADMIN_ONLY)
    for (method, path), refusal in ADMIN_ONLY.items():
        request = make_mocked_request(method, path)  # no app: a view that ran would fail otherwise
        request[REQUEST_PRINCIPAL] = ApiKeyRecord(key_id="k", role=role, label="not an admin", user_id="u")
        view = rows[method, path].handler
        assert not isinstance(view, type)
        with pytest.raises(ApiError) as refused:
            await view(request)
        assert (refused.value.status, refused.value.body.message, refused.value.body.code) == (
            403, refusal, "insufficient_permissions"), path


def test_every_status_the_gateway_answers_is_in_the_document() -> None:
    paths = DOCUMENT["paths"]
    assert {"402", "503", "507"} <= set(paths["/v1/batches"]["post"]["responses"]), "billing, broker, full disk"
    assert {"402", "507"} <= set(paths["/v1/batches/{batch_id}/retry"]["post"]["responses"])
    assert {"408", "503", "507"} <= set(paths["/v1/files"]["post"]["responses"]), "an upload that came too slowly"
    assert "503" in paths["/v1/batches"]["get"]["responses"] and "507" not in paths["/v1/batches"]["get"]["responses"]


def test_a_query_parameter_with_fixed_values_says_them() -> None:
    batches = {p["name"]: p["schema"] for p in DOCUMENT["paths"]["/v1/batches"]["get"]["parameters"]}
    files = {p["name"]: p["schema"] for p in DOCUMENT["paths"]["/v1/files"]["get"]["parameters"]}
    assert "validated" in batches["status"]["enum"] and batches["search"]["maxLength"] == 512
    assert {"batch", "batch_output", "evals"} <= set(files["purpose"]["enum"])
