"""The dashboard in a real headless Chromium: sign in, see grouped errors, run a batch, download, manage keys."""

import json
import os
import re
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect, sync_playwright

from tests.e2e.conftest import ADMIN_KEY, RunningStack
from tests.factories import chat_line

CHROMIUM = "/usr/bin/chromium"
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                                 reason=f"Debian's chromium is not installed at {CHROMIUM}")]
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


class Shots:
    """Screenshots of each page, in the test's tmp dir and, when SHESHNAG_ARTIFACTS is set, there too."""

    def __init__(self, page: Page, tmp_path: Path) -> None:
        self.page, self.dirs = page, [tmp_path / "screenshots"]
        if os.environ.get("SHESHNAG_ARTIFACTS"):
            self.dirs.append(Path(os.environ["SHESHNAG_ARTIFACTS"]) / "dashboard")
        for folder in self.dirs:
            folder.mkdir(parents=True, exist_ok=True)

    def take(self, name: str) -> None:
        assert self.page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), \
            f"the {name} page scrolls sideways at 1280px"
        self.page.screenshot(path=self.dirs[0] / f"{name}.png", full_page=True)
        for folder in self.dirs[1:]:
            shutil.copy(self.dirs[0] / f"{name}.png", folder / f"{name}.png")


def jsonl_file(lines: list[str]) -> dict[str, object]:
    return {"name": "requests.jsonl", "mimeType": "application/jsonl", "buffer": "\n".join(lines).encode() + b"\n"}


def test_a_user_signs_in_fixes_a_file_runs_it_downloads_it_and_manages_keys(
        stack: RunningStack, browser: Browser, tmp_path: Path) -> None:
    origin = f"http://127.0.0.1:{stack.port}"
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    page = context.new_page()
    page.on("dialog", lambda dialog: dialog.accept())
    shots = Shots(page, tmp_path)

    page.goto(f"{origin}/dashboard/")
    page.get_by_label("API key").fill(ADMIN_KEY)
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#status")).to_contain_text("Signed in", timeout=10_000)
    shots.take("signin")

    page.get_by_role("navigation").get_by_role("link", name="New batch").click()
    expect(page.locator("#samples pre").first).to_contain_text('"custom_id"')
    good = json.dumps(chat_line("ok-1", "Say hi."))
    page.get_by_label("JSONL file").set_input_files(jsonl_file(  # type: ignore[arg-type]
        [good, "{broken", json.dumps(chat_line("bad-model", "hi", model="nope")), "{also broken"]))
    page.get_by_role("button", name="Upload and validate").click()
    expect(page.locator("#status")).to_contain_text("Validation failed", timeout=30_000)
    invalid_json = page.locator('.error-group[data-code="invalid_json"]')
    expect(invalid_json.locator(".lines")).to_have_text("2, 4", timeout=10_000)
    expect(page.locator('.error-group[data-code="unsupported_model"] .lines')).to_have_text("3")
    expect(page.locator('.error-group[data-code="unsupported_model"]')).to_contain_text("body.model")
    expect(invalid_json.locator(".fix")).not_to_be_empty()
    shots.take("new-batch-errors")

    partial = page.get_by_label("Run the valid lines even if some are refused (they go to the error file)")
    partial.check()  # the same broken file, its valid line let run: validated, and held like any other
    page.get_by_label("JSONL file").set_input_files(jsonl_file([good, "{broken"]))  # type: ignore[arg-type]
    page.get_by_role("button", name="Upload and validate").click()
    expect(page.locator("#status")).to_contain_text("Nothing has run yet", timeout=30_000)
    partial.uncheck()

    page.get_by_label("JSONL file").set_input_files(jsonl_file(  # type: ignore[arg-type]
        [json.dumps(chat_line("ok-1", "Say hi.")), json.dumps(chat_line("ok-2", "Name a colour."))]))
    page.get_by_role("button", name="Upload and validate").click()
    expect(page.locator("#status")).to_contain_text("Nothing has run yet", timeout=30_000)
    expect(page.get_by_label("Upload progress")).to_have_attribute("value", "100")
    held_id = page.locator("#status").inner_text()  # the batch waits, validated, until Run is pressed
    assert "Valid: 2 lines" in held_id
    page.get_by_role("button", name="Run 2 lines").click()
    page.get_by_role("link", name="Watch the batch").click(timeout=30_000)
    expect(page.locator("#batch-status")).to_have_text("completed", timeout=45_000)
    expect(page.locator("#timeline li[data-type='batch.completed']")).to_have_count(1)
    shots.take("batch")
    with page.expect_download() as downloaded:
        page.get_by_role("button", name="Download output").click()
    output = [json.loads(line) for line in Path(downloaded.value.path()).read_text().splitlines()]
    assert sorted(line["custom_id"] for line in output) == ["ok-1", "ok-2"]
    batch_id = page.locator("#batch").get_attribute("data-batch-id")

    page.get_by_role("link", name="Batches", exact=True).click()
    expect(page.locator(f"tr[data-batch-id='{batch_id}'] .badge")).to_have_text("completed")
    shots.take("batches")

    page.get_by_role("link", name="API keys").click()
    page.get_by_label("Name").fill("dashboard-e2e")
    page.get_by_role("button", name="Create key").click()
    expect(page.locator("#raw")).to_contain_text("gk-", timeout=10_000)
    raw = page.locator("#raw").inner_text()
    models = f"{stack.base_url}/models"
    assert httpx2.get(models, headers={"Authorization": f"Bearer {raw}"}, timeout=10).status_code == 200
    row = page.locator("#keys tbody tr", has_text="dashboard-e2e")
    shots.take("keys")
    row.get_by_role("button", name="Revoke").click()
    expect(row.locator(".state")).to_have_text("revoked", timeout=10_000)
    assert httpx2.get(models, headers={"Authorization": f"Bearer {raw}"}, timeout=10).status_code == 401

    page.get_by_role("link", name="Provider").click()
    page.get_by_label("Provider name").fill("gpu-dashboard")
    page.get_by_role("button", name="Register provider").click()
    expect(page.get_by_label("Provider", exact=True)).to_contain_text("gpu-dashboard", timeout=10_000)
    page.get_by_label("Worker key name").fill("rack-1")
    page.get_by_role("button", name="Create worker key").click()
    expect(page.locator("#raw")).to_contain_text("wk-", timeout=10_000)
    expect(page.locator("#keys tbody tr", has_text="rack-1")).to_have_count(1)
    # The stack's executor joined with the operator's worker key: an admin sees it, with the lines it ran above.
    served = page.locator("#executors tbody tr[data-executor-id] .served").first
    expect(served).to_have_text(re.compile(r"^[1-9][0-9]*$"), timeout=15_000)
    expect(page.locator("#executors tbody tr[data-executor-id]").first).to_contain_text("live")
    shots.take("provider")

    page.get_by_role("link", name="Operator").click()
    expect(page.locator("#executors tbody")).to_contain_text("smollm2-135m-instruct-q4_1", timeout=10_000)
    expect(page.locator("#by-status")).to_contain_text("completed")
    # The batch above ran minutes ago at most: its owner has a share of what the fleet committed lately.
    expect(page.locator("#shares tbody tr[data-owner]").first).to_contain_text("%", timeout=10_000)
    anomalies = httpx2.get(f"{stack.base_url}/admin/anomalies", headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                           timeout=10).json()["data"]
    if anomalies:
        expect(page.locator("#anomalies tbody tr")).to_have_count(len(anomalies), timeout=10_000)
        expect(page.locator("#anomalies tbody")).to_contain_text(anomalies[0]["reason"])
    else:
        expect(page.locator("#anomalies tbody")).to_have_text("No anomalies: every fact fitted its aggregate.",
                                                              timeout=10_000)
    # Billing is off on this stack; an operator may still grant credit ahead of turning it on, and sees it at once.
    page.get_by_label("Amount (USD; negative takes credit back)").fill("12.5")
    page.get_by_role("button", name="Grant").click()
    expect(page.locator("#accounts tbody tr", has_text="default")).to_contain_text("12.500000", timeout=10_000)
    shots.take("operator")
    context.close()


def signed_in_page(stack: RunningStack, browser: Browser, key: str = ADMIN_KEY) -> tuple[BrowserContext, Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.goto(f"http://127.0.0.1:{stack.port}/dashboard/")
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#status")).to_contain_text("Signed in", timeout=10_000)
    return context, page


def line(custom_id: str, url: str = "/v1/chat/completions", method: str = "POST", **body: object) -> str:
    return json.dumps({"custom_id": custom_id, "method": method, "url": url, "body": {"model": "smollm2", **body}})


HELLO = [{"role": "user", "content": "Hi."}]
BAD_FILE: list[tuple[str, list[str]]] = [
    (line("ok", messages=HELLO), []),
    ("{broken", ["invalid_json"]),
    ("{broken too", ["invalid_json"]),
    (json.dumps(chat_line("nope", "Hi.", model="nope")), ["unsupported_model"]),
    (line("two-bad-fields", messages="Hi.", temperature="hot"), ["invalid_body", "invalid_body"]),
    (line("get", method="GET", messages=[]), ["invalid_method", "invalid_body"]),
    (line("ok", messages=HELLO), ["duplicate_custom_id"]),
    (line("streams", messages=HELLO, stream=True), ["stream_not_supported"]),
    (line("embeds", url="/v1/embeddings", input="Hi."), ["url_mismatch", "invalid_body"]),
]
"""Each line of a file with the errors validation finds in it: 8 of 9 lines are bad, with 11 errors among them."""


def test_the_validation_summary_counts_bad_lines_and_errors_once_and_the_endpoint_comes_from_the_file(
        stack: RunningStack, browser: Browser) -> None:
    errors = Counter(code for _, codes in BAD_FILE for code in codes)
    bad_lines = sum(1 for _, codes in BAD_FILE if codes)
    context, page = signed_in_page(stack, browser)
    page.goto(f"http://127.0.0.1:{stack.port}/dashboard/new")
    page.get_by_label("JSONL file").set_input_files(jsonl_file([text for text, _ in BAD_FILE]))  # type: ignore[arg-type]
    # Two urls in one file: the page asks which endpoint the batch is for (the other line is refused).
    expect(page.locator("#endpoint-note")).to_contain_text("2 endpoints", timeout=10_000)
    page.get_by_label("Endpoint").select_option("/v1/chat/completions")
    page.get_by_role("button", name="Upload and validate").click()
    expect(page.locator("#status")).to_contain_text(
        f"Validation failed: {errors.total()} errors on {bad_lines} of its {len(BAD_FILE)} lines;", timeout=30_000)
    expect(page.locator("#errors .error-total")).to_have_text(
        f"{errors.total()} errors on {bad_lines} lines, of {len(errors)} kinds:", timeout=10_000)
    for code, count in errors.items():
        shown = page.locator(f'#errors [data-code="{code}"]')
        expect(shown).to_have_count(1)  # one count per kind: not again among the error file's lines
        expect(shown).to_have_attribute("data-count", str(count))
        expect(shown.locator("h3")).to_contain_text(f"({count} error{'s' if count > 1 else ''})")
    expect(page.locator('#errors .failed-by-code li[data-stage="refused"]')).to_have_attribute(
        "data-count", str(bad_lines))
    expect(page.locator('#errors .failed-by-code li[data-code="batch_failed_validation"]')).to_have_attribute(
        "data-count", str(len(BAD_FILE) - bad_lines))

    # One url in every line: that is the endpoint, and nothing is asked.
    embed = line("e-1", url="/v1/embeddings", input="Hello.").replace('"smollm2"', '"smollm2-135m-embed"')
    page.get_by_label("JSONL file").set_input_files(jsonl_file([embed]))  # type: ignore[arg-type]
    expect(page.locator("#endpoint-found")).to_have_text("/v1/embeddings", timeout=10_000)
    expect(page.get_by_label("Endpoint")).to_be_hidden()
    page.get_by_role("button", name="Upload and validate").click()
    expect(page.locator("#status")).to_contain_text("Valid: 1 line for smollm2-135m-embed", timeout=30_000)
    context.close()


def test_an_unknown_batch_id_says_the_batch_was_not_found(stack: RunningStack, browser: Browser) -> None:
    context, page = signed_in_page(stack, browser)
    page.goto(f"http://127.0.0.1:{stack.port}/dashboard/batches/batch_000000000000000000000000")
    expect(page.get_by_role("alert")).to_contain_text("Batch not found", timeout=10_000)
    expect(page.get_by_role("heading", name="Batch not found")).to_be_visible()
    expect(page.locator("#summary")).to_have_count(0)  # no empty cards
    expect(page.get_by_role("link", name="See your batches")).to_be_visible()
    expect(page.locator("#status")).to_be_empty()
    context.close()


def test_a_key_without_the_admin_role_is_not_offered_the_operator_page_and_is_told_it_needs_one(
        stack: RunningStack, browser: Browser) -> None:
    made = httpx2.post(f"{stack.base_url}/organization/keys", json={"name": "dashboard-user", "role": "user"},
                       headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=30)
    assert made.status_code == 200, made.text
    context, page = signed_in_page(stack, browser, made.json()["value"])
    nav = page.get_by_role("navigation")
    expect(page.locator("#who")).to_contain_text("(user)", timeout=10_000)
    expect(nav.get_by_role("link", name="Operator")).to_be_hidden()
    expect(nav.get_by_role("link", name="Batches", exact=True)).to_be_visible()
    # Reached by its address anyway, the page says what it needs in plain words, not the API's refusal.
    page.goto(f"http://127.0.0.1:{stack.port}/dashboard/operator")
    notice = page.get_by_role("alert")
    expect(notice.get_by_role("heading")).to_have_text("This page needs an admin key", timeout=10_000)
    expect(notice).to_contain_text("The key you signed in with is a user key")
    expect(page.locator("main")).not_to_contain_text("Only an admin key may manage")
    expect(page.locator("#executors")).to_be_hidden()
    context.close()
