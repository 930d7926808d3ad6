"""`/openapi.json` against the gateway's own router: every route is described by hand, none by the fallback."""

from services.gateway.app import create_app
from services.gateway.dashboard.pages import PREFIX as DASHBOARD
from services.gateway.openapi import build_openapi
from services.gateway.settings import GatewaySettings


def app_routes() -> set[tuple[str, str]]:
    """(method, path) of every route but HEAD twins and the dashboard's HTML pages and static files."""
    app = create_app(GatewaySettings())
    return {(route.method.lower(), route.resource.canonical) for route in app.router.routes()
            if route.resource is not None and route.method != "HEAD"
            and not route.resource.canonical.startswith(DASHBOARD)}


def test_every_route_of_the_app_is_described_in_the_document() -> None:
    paths = build_openapi()["paths"]  # without the app's routes: only what is described by hand
    missing = sorted(f"{method.upper()} {path}" for method, path in app_routes() if method not in paths.get(path, {}))
    assert missing == []


def test_the_document_describes_no_route_the_app_lacks() -> None:
    routes = app_routes()
    described = {(method, path) for path, operations in build_openapi()["paths"].items() for method in operations}
    assert sorted(described - routes) == []


def test_admin_routes_say_a_user_key_gets_403() -> None:
    paths = build_openapi()["paths"]
    for path in ("/v1/organization/organizations", "/v1/organization/users", "/v1/organization/keys"):
        for operation in paths[path].values():
            assert operation["responses"]["403"]["content"]["application/json"]["schema"] == {
                "$ref": "#/components/schemas/ErrorResponse"}


def test_every_operation_has_a_unique_id() -> None:
    ids = [op["operationId"] for operations in build_openapi()["paths"].values() for op in operations.values()]
    assert len(ids) == len(set(ids))
