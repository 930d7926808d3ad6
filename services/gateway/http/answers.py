"""A contract object as the JSON answer, marked when it is an earlier object returned for an identical create."""

from aiohttp import web
from pydantic import BaseModel

DEDUPLICATED_FROM = "X-Sheshnag-Deduplicated-From"


def answer(created: BaseModel, same_as: str | None = None) -> web.Response:
    """`created`; `same_as` says it is an earlier object returned for an identical create (a retry or a twin)."""
    return web.json_response(created.model_dump(mode="json"), headers={DEDUPLICATED_FROM: same_as} if same_as else None)
