"""Cursor pagination as the OpenAI SDK drives it: `limit` and `after=<last id>`."""

from collections.abc import Sequence
from typing import TypeVar

from aiohttp import web
from pydantic import BaseModel

from contracts.api.page import ListPage
from services.gateway.errors import bad_request

Item = TypeVar("Item", bound=BaseModel)
MAX_LIMIT = 100


def parse_limit(request: web.Request, default: int = 20) -> int:
    raw = request.query.get("limit", str(default))
    try:
        limit = int(raw)
    except ValueError:
        raise bad_request(f"limit must be an integer, not {raw!r}.", "invalid_limit", "limit") from None
    if not 1 <= limit <= MAX_LIMIT:
        raise bad_request(f"limit must be between 1 and {MAX_LIMIT}.", "invalid_limit", "limit")
    return limit


def page_after(items: Sequence[Item], ids: Sequence[str], after: str | None, limit: int) -> ListPage[Item]:
    """`items` already in list order; `ids[i]` is the id of `items[i]`."""
    start = ids.index(after) + 1 if after is not None and after in ids else 0
    chosen = list(items[start:start + limit])
    chosen_ids = list(ids[start:start + limit])
    return ListPage[Item](
        data=chosen,
        first_id=chosen_ids[0] if chosen_ids else None,
        last_id=chosen_ids[-1] if chosen_ids else None,
        has_more=start + limit < len(items),
    )
