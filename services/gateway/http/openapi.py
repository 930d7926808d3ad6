"""A route as the table declares it (method, path, handler, and what it takes and answers), and `/openapi.json`
generated from that table: each operation's schemas are its pydantic request and response models."""

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Literal

from aiohttp import web
from aiohttp.abc import AbstractView
from aiohttp.typedefs import Handler
from aiohttp.web_routedef import AbstractRouteDef, RouteDef
from aiohttp.web_urldispatcher import AbstractRoute, UrlDispatcher
from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from contracts.api.error import ErrorResponse
from services.gateway.http.auth import admin_only

JsonObject = dict[str, Any]
Access = Literal["public", "key", "self", "admin"]
"""Who may call: anyone; any user or admin key (a worker key is refused); any such key, for its own user only (an
admin key for anyone, others get 403); admin keys only (a user key gets 403)."""


@dataclass(frozen=True)
class Answer:
    """A 200 answer that is not one JSON model: bytes, text, or a stream whose events each carry `event_data`."""

    description: str
    media_type: str
    schema: JsonObject = field(default_factory=lambda: {"type": "string"})
    event_data: type[BaseModel] | None = None


@dataclass(frozen=True)
class Operation:
    operation_id: str
    summary: str
    ok: type[BaseModel] | Answer | None = None
    """The 200 answer: a model (as JSON), an `Answer`, or nothing described."""
    body: type[BaseModel] | JsonObject | None = None
    """The request body: a model (as JSON), or a whole content map (the multipart upload)."""
    params: tuple[JsonObject, ...] = ()
    """Query and header parameters; path parameters come from the path."""
    access: Access = "key"
    refusal: str = "Only an admin key may manage users and keys."
    """With `access="admin"`, what any other key is told (403)."""
    unavailable: str | None = None
    """When set, the operation also answers 503 (described so), with the 200's media and schema."""
    errors: tuple[tuple[str, str], ...] = ()
    """Statuses this operation alone answers besides the common ones, each with its description."""


@dataclass(frozen=True)
class Route(AbstractRouteDef):
    """One row of the route table: aiohttp registers it like `web.get(...)`, the document describes it."""

    method: str
    path: str
    handler: Handler | type[AbstractView]
    operation: Operation

    def register(self, router: UrlDispatcher) -> list[AbstractRoute]:
        return RouteDef(self.method, self.path, self.handler, {}).register(router)


def route(method: str, path: str, handler: Handler, operation_id: str, summary: str,
          ok: type[BaseModel] | Answer | None = None, **more: Any) -> Route:
    """A row; with `access="admin"` its handler answers admin keys only, every other one 403."""
    operation = Operation(operation_id, summary, ok, **more)
    return Route(method, path, admin_only(handler, operation.refusal) if operation.access == "admin" else handler,
                 operation)


def query(name: str, schema: JsonObject) -> JsonObject:
    return {"name": name, "in": "query", "required": False, "schema": schema}


LIMIT = query("limit", {"type": "integer", "minimum": 1, "maximum": 100})
FILES_LIMIT = query("limit", {"type": "integer", "minimum": 1, "maximum": 10_000, "default": 10_000})
AFTER = query("after", {"type": "string", "minLength": 1})
"""The last id of the previous page (an empty one is refused: it is the id of nothing, not the first page)."""
ERRORS = {"400": "Invalid request", "401": "Missing or bad key", "403": "Not allowed for this key (a worker key, or a "
          "scope, organisation or provider the caller does not administer)", "404": "Not found (or not yours)",
          "409": "Conflict", "413": "Too large", "429": "Rate limited",
          "503": "The broker, the object store or the read model is slow or down, or a limit could not be decided now; "
                 "retry after Retry-After"}
WRITE_ERRORS = {"507": "A volume of the deployment is short of space (insufficient_storage); retry after Retry-After"}
"""What a request that stores something may also be answered, besides `ERRORS`."""
FORBIDDEN = {"admin": "Not an admin key", "self": "Not an admin key, and not for the key's own user"}


class _Schemas:
    """Every model the table names, generated together so each is one component and a `$ref` to it."""

    def __init__(self, routes: Sequence[Route]) -> None:
        wanted: dict[tuple[type[BaseModel], JsonSchemaMode], None] = {(ErrorResponse, "serialization"): None}
        for operation in (r.operation for r in routes):
            if isinstance(operation.body, type):
                wanted[operation.body, "validation"] = None
            if isinstance(operation.ok, type):
                wanted[operation.ok, "serialization"] = None
            elif isinstance(operation.ok, Answer) and operation.ok.event_data is not None:
                wanted[operation.ok.event_data, "serialization"] = None
        refs, schemas = models_json_schema(list(wanted), ref_template="#/components/schemas/{model}")
        self.refs = {key: dict(ref) for key, ref in refs.items()}
        self.components: JsonObject = schemas.get("$defs", {})

    def json(self, model: type[BaseModel], mode: JsonSchemaMode, description: str = "OK") -> JsonObject:
        return {"description": description, "content": {"application/json": {"schema": self.refs[model, mode]}}}

    def answer(self, ok: type[BaseModel] | Answer | None) -> JsonObject:
        if ok is None:
            return {"description": "OK"}
        if isinstance(ok, type):
            return self.json(ok, "serialization")
        media: JsonObject = {"schema": ok.schema}
        if ok.event_data is not None:
            media["x-sheshnag-event-data"] = self.refs[ok.event_data, "serialization"]
        return {"description": ok.description, "content": {ok.media_type: media}}

    def operation(self, route: Route) -> JsonObject:
        op = route.operation
        params = [{"name": part[1:-1], "in": "path", "required": True, "schema": {"type": "string"}}
                  for part in documented_path(route.path).split("/") if part.startswith("{")]
        described: JsonObject = {"operationId": op.operation_id, "summary": op.summary,
                                 "parameters": params + list(op.params), "responses": {"200": self.answer(op.ok)}}
        if op.access == "public":
            described["security"] = []
        else:
            more = WRITE_ERRORS if route.method in ("POST", "PUT", "PATCH") else {}
            described["responses"] |= {status: self.json(ErrorResponse, "serialization", text)
                                       for status, text in {**ERRORS, **more, **dict(op.errors)}.items()}
        if op.unavailable is not None:
            described["responses"]["503"] = {**self.answer(op.ok), "description": op.unavailable}
        if op.access in FORBIDDEN:
            described["responses"]["403"] = self.json(ErrorResponse, "serialization", FORBIDDEN[op.access])
        if op.body is not None:
            content = op.body if isinstance(op.body, dict) else {
                "application/json": {"schema": self.refs[op.body, "validation"]}}
            described["requestBody"] = {"required": body_required(op.body), "content": content}
        return described


_PARAMETER_WITH_PATTERN = re.compile(r"\{([_a-zA-Z][_a-zA-Z0-9]*):[^{}]*(?:\{[^{}]*\}[^{}]*)*\}")


def documented_path(path: str) -> str:
    """`path` as the document names it: a parameter's pattern (`{batch_id:(?!quote$)[^/]+}`, which keeps a fixed
    path such as `/v1/batches/quote` from also matching the parameter) left out."""
    return _PARAMETER_WITH_PATTERN.sub(r"{\1}", path)


def body_required(body: type[BaseModel] | JsonObject) -> bool:
    """Whether a request must send a body: a JSON body whose every field has a default may be left out (it is read as
    `{}`); the multipart upload may not."""
    return isinstance(body, dict) or any(field.is_required() for field in body.model_fields.values())


def _guessed(row: RouteDef) -> Route:
    """A row written as plain `web.get(...)`: served, but the document can only guess at it."""
    name = row.method.lower() + "".join(p.strip("{}").title() for p in row.path.split("/") if p).replace("_", "")
    access: Access = "key" if row.path.startswith("/v1/") else "public"
    return Route(row.method, row.path, row.handler, Operation(name, f"{row.method} {row.path}", access=access))


def _links_of(created: Route, routes: Sequence[Route]) -> JsonObject:
    """A create's links (`POST /v1/files` answering an `id`) to each operation on what it made (`/v1/files/{file_id}`
    and below), the id its path parameter: how a client, or a fuzzer, goes from making a thing to using it."""
    ok = created.operation.ok
    if created.method != "POST" or "{" in created.path or not (isinstance(ok, type) and "id" in ok.model_fields):
        return {}
    links: JsonObject = {}
    for row in routes:
        path = documented_path(row.path)
        streams = isinstance(row.operation.ok, Answer) and row.operation.ok.media_type == "text/event-stream"
        if path.startswith(f"{created.path}/{{") and not streams:  # a stream lasts as long as its batch
            parameter = path[len(created.path) + 2:].split("}", 1)[0]
            links[row.operation.operation_id] = {"operationId": row.operation.operation_id,
                                                 "parameters": {parameter: "$response.body#/id"}}
    return links


def build_openapi(table: Iterable[AbstractRouteDef]) -> JsonObject:
    """The document of a route table: one operation per row (described rows first, then any guessed)."""
    rows = list(table)
    routes = [r for r in rows if isinstance(r, Route)] + [_guessed(r) for r in rows if isinstance(r, RouteDef)]
    schemas = _Schemas(routes)
    paths: JsonObject = {}
    for row in routes:
        paths.setdefault(documented_path(row.path), {})[row.method.lower()] = schemas.operation(row)
    for row in routes:
        if links := _links_of(row, routes):
            paths[row.path]["post"]["responses"]["200"]["links"] = links
    return {
        "openapi": "3.1.0",
        "info": {"title": "Sheshnag", "version": "1", "description": "OpenAI-compatible Batch API."},
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {"schemas": schemas.components,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }


def openapi_view(table: Sequence[AbstractRouteDef]) -> Handler:
    """`GET /openapi.json` for `table` (the document is built on the first request, then kept)."""
    document = cache(lambda: json.dumps(build_openapi(table)))

    async def openapi_json(request: web.Request) -> web.Response:
        return web.Response(text=document(), content_type="application/json")

    return openapi_json
