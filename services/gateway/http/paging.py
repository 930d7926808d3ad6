"""Cursor pagination as the OpenAI SDK drives it: `limit` and `after=<last id>`."""

from collections.abc import Sequence
from typing import TypeVar

from aiohttp import web
from pydantic import BaseModel

from contracts.api.page import ListPage
from services.gateway.usecases.refusals import ascii_int, bad_request

Item = TypeVar("Item", bound=BaseModel)
MAX_LIMIT = 100
MAX_FILES_LIMIT = 10_000
"""`GET /v1/files` pages up to 10,000 files, and returns that many by default, as OpenAI's does."""


def parse_limit(request: web.Request, default: int = 20, maximum: int = MAX_LIMIT) -> int:
    raw = request.query.get("limit", str(default))
    limit = ascii_int(raw, 9)
    if limit is None or not 1 <= limit <= maximum:
        raise bad_request(f"limit must be an integer between 1 and {maximum}, not {raw[:20]!r}.", "invalid_limit",
                          "limit")
    return limit


def limit_of(raw: str | None, default: int, maximum: int) -> int:
    """An extension list's `?limit=`: `default` when absent, else 1 to `maximum`."""
    limit = default if raw is None else ascii_int(raw, 9)
    if limit is None or not 1 <= limit <= maximum:
        raise bad_request(f"limit must be an integer from 1 to {maximum}.", "invalid_limit", "limit")
    return limit


def page_after(items: Sequence[Item], ids: Sequence[str], after: str | None, limit: int,
               gone_at: int | None = None) -> ListPage[Item]:
    """`items` in list order, `ids` theirs. An `after` no longer in `ids` (deleted since the last page) pages on from
    where it stood: `gone_at`, the index of the first item past it; one that never was is a 400, never a restart."""
    if after is not None and after not in ids and gone_at is None:
        raise bad_request(f"after must be the id of an object in this list; {after[:128]!r} is not.", "invalid_after",
                          "after")
    start = (ids.index(after) + 1 if after in ids else gone_at or 0) if after is not None else 0
    chosen_ids = list(ids[start:start + limit])
    return ListPage[Item](data=list(items[start:start + limit]), first_id=chosen_ids[0] if chosen_ids else None,
                          last_id=chosen_ids[-1] if chosen_ids else None, has_more=start + limit < len(items))
