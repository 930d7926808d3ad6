"""The dashboard with the keyboard only (Tab, Shift+Tab, Enter, Space; never the mouse): every step reaches the
control it needs, focus lands somewhere sensible after each action, and the focused element is always visible."""

from collections.abc import Callable
from typing import Any

from playwright.sync_api import Browser, Page, expect

from tests.e2e.conftest import ADMIN_KEY, RunningStack
from tests.e2e.test_dashboard import browser, pytestmark

__all__ = ["browser", "pytestmark"]

Focused = dict[str, Any]
MAX_PRESSES = 60

DESCRIBE_FOCUS = """() => {
  const el = document.activeElement;
  const style = getComputedStyle(el);
  return {tag: el.tagName.toLowerCase(), id: el.id, text: (el.innerText || "").trim(),
          label: el.getAttribute("aria-label") || "", href: el.getAttribute("href") || "",
          visible: el !== document.body && el.matches(":focus-visible") && style.outlineStyle !== "none"
                   && parseFloat(style.outlineWidth) > 0};
}"""


def focused(page: Page) -> Focused:
    described: Focused = page.evaluate(DESCRIBE_FOCUS)
    assert described["visible"], f"the focused element shows no focus ring: {described}"
    return described


def tab_to(page: Page, wanted: Callable[[Focused], bool], backwards: bool = False) -> Focused:
    """Press Tab (or Shift+Tab) until `wanted` accepts the focused element; each stop must show its focus."""
    for _ in range(MAX_PRESSES):
        page.keyboard.press("Shift+Tab" if backwards else "Tab")
        now = focused(page)
        if wanted(now):
            return now
    raise AssertionError(f"{MAX_PRESSES} presses of {'Shift+Tab' if backwards else 'Tab'} never reached it")


def by_id(ident: str) -> Callable[[Focused], bool]:
    return lambda f: f["id"] == ident


def nav_link(name: str) -> Callable[[Focused], bool]:
    return lambda f: f["tag"] == "a" and f["text"] == name


def test_a_keyboard_user_signs_in_opens_new_batch_and_creates_then_revokes_a_key(
        stack: RunningStack, browser: Browser) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.on("dialog", lambda dialog: dialog.accept())  # the revoke confirmation, answered as Enter would
    page.goto(f"http://127.0.0.1:{stack.port}/dashboard/")

    page.keyboard.press("Tab")
    assert focused(page)["text"] == "Skip to content"  # the first stop skips the navigation
    page.keyboard.press("Enter")
    tab_to(page, by_id("key"))
    page.keyboard.type(ADMIN_KEY)
    page.keyboard.press("Enter")
    expect(page.locator("#status")).to_contain_text("Signed in", timeout=10_000)

    tab_to(page, nav_link("New batch"), backwards=True)
    page.keyboard.press("Enter")
    expect(page).to_have_url(f"http://127.0.0.1:{stack.port}/dashboard/new")
    expect(page.get_by_role("heading", level=1)).to_have_text("New batch")
    tab_to(page, by_id("file"))  # first on the page; the endpoint is read from the file, asked only when unclear
    page.keyboard.press("Tab")
    assert focused(page)["id"] == "placement"
    page.keyboard.press("Tab")
    assert focused(page)["id"] == "allow-partial"
    page.keyboard.press("Tab")
    assert focused(page)["text"] == "Upload and validate"

    tab_to(page, nav_link("API keys"), backwards=True)
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", level=1)).to_have_text("API keys")
    tab_to(page, by_id("name"))
    page.keyboard.type("keyboard-only")
    for control in ("role", "user"):
        page.keyboard.press("Tab")
        assert focused(page)["id"] == control
    page.keyboard.press("Tab")
    assert focused(page)["text"] == "Create key"
    page.keyboard.press("Shift+Tab")
    assert focused(page)["id"] == "user"
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    expect(page.locator("#raw")).to_contain_text("gk-", timeout=10_000)
    expect(page.locator("#copy")).to_be_focused()  # straight to the one-time value's Copy button
    assert focused(page)["text"] == "Copy"

    key_id = page.locator("#status").inner_text().removeprefix("Created ").split(".")[0]
    revoke = tab_to(page, lambda f: f["label"] == f"Revoke keyboard-only ({key_id})")
    assert revoke["tag"] == "button"
    page.keyboard.press("Space")
    expect(page.locator(f"#keys tr[data-key-id='{key_id}'] .state")).to_have_text("revoked", timeout=10_000)
    expect(page.locator("#status")).to_be_focused()  # its button is gone: focus lands on the outcome
    assert focused(page)["text"] == f"Revoked {key_id}."
    context.close()
