"""Server-rendered dashboard pages under `/dashboard`; every datum is fetched by the page's script from /v1."""

from dataclasses import dataclass
from functools import cache, partial
from html import escape
from importlib import resources

from aiohttp import web

PREFIX = "/dashboard"


@dataclass(frozen=True)
class Page:
    path: str
    template: str
    """The page's template under templates/, and its script under static/."""
    title: str
    nav: str | None
    """The label in the navigation bar; None: not linked from it."""


PAGES = [
    Page("", "signin", "Sign in", "Sign in"),
    Page("/new", "new", "New batch", "New batch"),
    Page("/batches", "batches", "Batches", "Batches"),
    Page("/batches/{batch_id}", "batch", "Batch", None),
    Page("/keys", "keys", "API keys", "API keys"),
    Page("/webhooks", "webhooks", "Webhooks", "Webhooks"),
    Page("/provider", "provider", "Provider portal", "Provider"),
    Page("/operator", "operator", "Operator view", "Operator"),
]


@cache
def _template(name: str) -> str:
    return (resources.files(__package__) / "templates" / f"{name}.html").read_text(encoding="utf-8")


def _nav(current: Page) -> str:
    links = []
    for page in PAGES:
        if page.nav is None:
            continue
        here = ' aria-current="page"' if page is current else ""
        links.append(f'<li><a href="{PREFIX}{page.path or "/"}"{here}>{escape(page.nav)}</a></li>')
    return "".join(links)


def render(page: Page, request: web.Request) -> str:
    params = {key: escape(value) for key, value in request.match_info.items()}
    body = _template(page.template).format(**params)
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{escape(page.title)} · Sheshnag</title>"
            f'<link rel="stylesheet" href="{PREFIX}/static/dashboard.css"></head><body>'
            f'<a class="skip" href="#main">Skip to content</a>'
            f'<header><p class="brand">Sheshnag</p><nav aria-label="Dashboard"><ul>{_nav(page)}</ul></nav>'
            f'<p class="who" id="who" aria-live="polite"></p></header>'
            f'<main id="main" tabindex="-1"><h1>{escape(page.title)}</h1>{body}</main>'
            f'<script src="{PREFIX}/static/api.js"></script>'
            f'<script src="{PREFIX}/static/{page.template}.js"></script></body></html>')


async def _view(page: Page, request: web.Request) -> web.StreamResponse:
    return web.Response(text=render(page, request), content_type="text/html", headers={"Cache-Control": "no-store"})


async def _redirect(request: web.Request) -> web.Response:
    raise web.HTTPFound(f"{PREFIX}/")


def add_dashboard(app: web.Application) -> None:
    """The pages and their static files; all public, since the key lives in the browser's session."""
    app.router.add_get(PREFIX, _redirect)
    for page in PAGES:
        app.router.add_get(f"{PREFIX}{page.path or '/'}", partial(_view, page))
    app.router.add_static(f"{PREFIX}/static", str(resources.files(__package__) / "static"))
