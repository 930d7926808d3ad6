"""The dashboard's pages and scripts are served without a key, from package data, with ids escaped."""

from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from services.gateway.dashboard.pages import PAGES, PREFIX, add_dashboard

Client = TestClient[web.Request, web.Application]


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    app = web.Application()
    add_dashboard(app)
    async with TestClient(TestServer(app)) as running:
        yield running


async def test_every_page_is_html_with_a_landmark_navigation_and_its_script(client: Client) -> None:
    for page in PAGES:
        path = PREFIX + (page.path.replace("{batch_id}", "batch_1") or "/")
        response = await client.get(path)
        assert response.status == 200, path
        html = await response.text()
        assert '<main id="main"' in html and '<nav aria-label="Dashboard">' in html
        script = await client.get(f"{PREFIX}/static/{page.template}.js")
        assert script.status == 200, page.template


async def test_a_batch_id_in_the_path_is_escaped_into_the_page(client: Client) -> None:
    html = await (await client.get(f"{PREFIX}/batches/%3Cscript%3Ex")).text()
    assert "<script>x" not in html and "&lt;script&gt;x" in html


async def test_the_bare_prefix_redirects_to_sign_in(client: Client) -> None:
    response = await client.get(PREFIX, allow_redirects=False)
    assert response.status == 302 and response.headers["Location"] == f"{PREFIX}/"
