"""The dashboard fits a phone and a laptop: at 390 px and 1280 px no page scrolls sideways, nothing scrolls sideways
inside a card (at 390 px each table row is a card of label: value pairs), every row's state and Revoke button lie
within the window, no id or state badge breaks over two lines, and the upload form is in the first screenful.
Checked in Chromium, every page, with data on it."""

import json
from pathlib import Path
from typing import Any

import httpx2
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect

from tests.e2e.conftest import ADMIN_KEY, RunningStack
from tests.e2e.test_dashboard import CHROMIUM, browser
from tests.factories import chat_line, upload, wait_until_done

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                                 reason=f"Debian's chromium is not installed at {CHROMIUM}")]

WIDTHS = (390, 1280)
FILLED = {"/dashboard/keys": "#keys td.state", "/dashboard/webhooks": "#endpoints td.state"}
"""Pages whose checks need their rows in place first."""
__all__ = ["browser"]  # the fixture: one Chromium per module, as the dashboard test starts it


def signed_in(stack: RunningStack, browser: Browser, width: int) -> tuple[BrowserContext, Page]:
    """A new browser context at `width` px, signed in with the admin key; confirmation dialogs accepted."""
    context = browser.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    page.on("dialog", lambda dialog: dialog.accept())
    page.goto(f"http://127.0.0.1:{stack.port}/dashboard/")
    page.get_by_label("API key").fill(ADMIN_KEY)
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#status")).to_contain_text("Signed in", timeout=10_000)
    return context, page


def overflow(page: Page) -> int:
    """How far the page reaches past the window's right edge (0: it fits)."""
    width: int = page.evaluate("Math.max(document.documentElement.scrollWidth, document.body.scrollWidth)"
                               " - window.innerWidth")
    return width


def broken_badges(page: Page) -> list[str]:
    found: list[str] = page.evaluate(
        "[...document.querySelectorAll('.badge')].filter(b => b.getClientRects().length > 1)"
        ".map(b => b.textContent)")
    return found


LAYOUT_PROBLEMS = """() => {
  const problems = [];
  const shown = (e) => e.getClientRects().length > 0;
  const textLines = (e) => {  // how many lines the element's text takes (a word broken over two: 2)
    const tops = new Set();
    const walker = document.createTreeWalker(e, NodeFilter.SHOW_TEXT);
    while (walker.nextNode()) {
      if (!walker.currentNode.textContent.trim()) continue;
      const range = document.createRange();
      range.selectNodeContents(walker.currentNode);
      for (const rect of range.getClientRects()) if (rect.width > 0) tops.add(Math.round(rect.top));
    }
    return tops.size;
  };
  for (const box of document.querySelectorAll('.card, .table-wrap')) {
    if (shown(box) && box.scrollWidth > box.clientWidth + 1) {
      problems.push(`scrolls sideways inside: ${box.id || box.querySelector('table, h2')?.id || box.className}`);
    }
  }
  const oneLine = document.querySelectorAll('.badge, td.state, tr[data-key-id] code, tr[data-executor-id] code');
  for (const e of oneLine) {
    if (shown(e) && textLines(e) > 1) problems.push(`over ${textLines(e)} lines: ${e.textContent}`);
  }
  const rowParts = [...document.querySelectorAll('td.state, td button')].filter(shown);
  for (const e of rowParts) {
    const rect = e.getBoundingClientRect();
    const frame = e.closest('.table-wrap')?.getBoundingClientRect() || {left: 0, right: innerWidth};
    if (rect.left < Math.max(0, frame.left) - 1 || rect.right > Math.min(innerWidth, frame.right) + 1) {
      problems.push(`outside the window: ${e.textContent} (${Math.round(rect.left)}-${Math.round(rect.right)})`);
    }
  }
  return problems;
}"""


def layout_problems(page: Page) -> list[str]:
    """What breaks the layout's promises on the page as it stands (empty: nothing)."""
    found: list[str] = page.evaluate(LAYOUT_PROBLEMS)
    return found


def upload_form_in_first_screen(page: Page) -> bool:
    fits: bool = page.evaluate("""() => {
      const form = document.getElementById('upload').getBoundingClientRect();
      const file = document.getElementById('file').getBoundingClientRect();
      return form.top >= 0 && file.bottom <= innerHeight;
    }""")
    return fits


def admin_post(stack: RunningStack, path: str, body: dict[str, Any]) -> dict[str, Any]:
    made = httpx2.post(f"{stack.base_url}{path}", json=body, headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                       timeout=30)
    assert made.status_code == 200, made.text
    answer: dict[str, Any] = made.json()
    return answer


@pytest.mark.parametrize("width", WIDTHS)
def test_no_page_or_card_scrolls_sideways_and_no_id_or_badge_breaks(
        stack: RunningStack, browser: Browser, width: int) -> None:
    client = stack.client()
    batch = client.batches.create(input_file_id=upload(client, [chat_line("w-1", "Hi.", max_tokens=2)]),
                                  endpoint="/v1/chat/completions", completion_window="24h",
                                  metadata={"purpose": json.dumps({"a rather long": "metadata value" * 3})})
    # Rows in the tables with a state: a worker key, and a webhook whose long URL squeezes its table.
    provider = admin_post(stack, "/provider/providers", {"name": f"widths-{width}"})
    admin_post(stack, f"/provider/providers/{provider['id']}/worker_keys", {"name": f"rack-{width}"})
    webhook = admin_post(stack, "/webhooks", {"url": f"https://hooks.example.com/a/rather/long/path/for/sheshnag/"
                                                     f"webhooks/{width}/endpoint/{stack.port}",
                                                     "events": ["batch.completed", "batch.failed", "batch.expired",
                                                                "batch.cancelled", "batch.validated"]})
    wait_until_done(client, batch.id)
    context, page = signed_in(stack, browser, width)
    for path in ("/dashboard/", "/dashboard/new", "/dashboard/batches", f"/dashboard/batches/{batch.id}",
                 "/dashboard/keys", "/dashboard/webhooks", "/dashboard/provider", "/dashboard/operator"):
        page.goto(f"http://127.0.0.1:{stack.port}{path}")
        page.wait_for_load_state("networkidle")
        page.wait_for_timeout(500)  # the page's script fills its tables
        if path in FILLED:
            expect(page.locator(FILLED[path]).first).to_be_visible(timeout=10_000)
        assert overflow(page) <= 0, f"{path} at {width}px reaches {overflow(page)}px past the window"
        assert broken_badges(page) == [], f"{path} at {width}px breaks badges: {broken_badges(page)}"
        assert layout_problems(page) == [], f"{path} at {width}px"
        if path == "/dashboard/new":
            assert upload_form_in_first_screen(page), f"the upload form is below the first screen at {width}px"
    context.close()
    httpx2.delete(f"{stack.base_url}/webhooks/{webhook['id']}", headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                  timeout=30)


def test_the_batches_list_filters_by_status_and_searches_metadata(stack: RunningStack, browser: Browser) -> None:
    client = stack.client()
    batch = client.batches.create(input_file_id=upload(client, [chat_line("f-1", "Hi.", max_tokens=2)]),
                                  endpoint="/v1/chat/completions", completion_window="24h",
                                  metadata={"project": "needle-in-haystack"})
    wait_until_done(client, batch.id)
    context, page = signed_in(stack, browser, 390)
    page.goto(f"http://127.0.0.1:{stack.port}/dashboard/batches")
    page.get_by_label("Status").select_option("completed")
    page.get_by_label("Search (batch id, metadata text, or key=value)").fill("project=needle")
    page.get_by_role("button", name="Show").click()
    rows = page.locator("#batches tbody tr[data-batch-id]")
    expect(rows).to_have_count(1, timeout=10_000)
    expect(rows.first).to_have_attribute("data-batch-id", batch.id)
    page.get_by_label("Status").select_option("failed")
    page.get_by_role("button", name="Show").click()
    expect(page.locator("#batches tbody")).to_contain_text("No batches here.", timeout=10_000)
    context.close()


def test_the_webhooks_page_adds_shows_disables_and_deletes_an_endpoint(stack: RunningStack, browser: Browser) -> None:
    context, page = signed_in(stack, browser, 390)
    page.goto(f"http://127.0.0.1:{stack.port}/dashboard/webhooks")
    url = f"https://hooks.example.com/sheshnag/{stack.port}"
    page.get_by_label("URL").fill(url)
    page.get_by_label("batch.validated").uncheck()
    page.get_by_role("button", name="Add endpoint").click()
    expect(page.locator("#secret")).to_contain_text("whsec_", timeout=10_000)
    row = page.locator("#endpoints tbody tr", has_text=url)
    expect(row).to_contain_text("batch.completed")
    expect(row).not_to_contain_text("batch.validated")
    row.get_by_role("button", name="Deliveries").click()
    expect(page.locator("#delivery-table tbody")).to_contain_text("Nothing sent yet")
    row.get_by_role("button", name="Disable").click()
    expect(row.locator(".state")).to_have_text("disabled", timeout=10_000)
    assert overflow(page) <= 0
    row.get_by_role("button", name=f"Delete {url}").click()
    expect(page.locator("#endpoints tbody tr", has_text=url)).to_have_count(0, timeout=10_000)
    context.close()


def test_a_batch_pages_status_line_and_error_panel_count_the_same_failed_lines(
        stack: RunningStack, browser: Browser) -> None:
    client = stack.client()
    lines: list[Any] = [chat_line("fine", "Hi.", max_tokens=2), b"{broken", b"{also broken"]
    batch = client.batches.create(input_file_id=upload(client, lines), endpoint="/v1/chat/completions",
                                  completion_window="24h", extra_body={"allow_partial": True})
    done, _ = wait_until_done(client, batch.id)
    assert done.request_counts is not None and done.request_counts.failed == 2
    context, page = signed_in(stack, browser, 390)
    page.goto(f"http://127.0.0.1:{stack.port}/dashboard/batches/{batch.id}")
    expect(page.locator("#summary")).to_contain_text("1 completed, 2 failed, 3 total", timeout=10_000)
    expect(page.locator("#errors .failed-lines")).to_have_text("2 failed lines in the error file:")
    refused = page.locator('#errors .failed-by-code li[data-stage="refused"]')
    expect(refused).to_have_text("2 refused by validation: their errors by kind are below")
    # Counted by kind in one place only: the validation errors, not again among the error file's lines.
    expect(page.locator('#errors [data-code="invalid_json"]')).to_have_count(1)
    expect(page.locator('#errors .error-group[data-code="invalid_json"]')).to_have_attribute("data-count", "2")
    context.close()
