"""Billing end to end, on a stack that bills (SHESHNAG_GATEWAY_BILLING=true) with the catalogue's model priced high
enough that tokens, not the batch minimum, make the price: quotes, the 402s, a reservation, debits as chunks commit,
the refund, credit run out mid-batch (`insufficient_credits`), the ledger SIGKILLed mid-batch (no double debit),
and a replay of the log that gives the same balances as the live ledger."""

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest

from contracts.billing import ModelPrice, parse_usd
from infra.backup import embedded_settings
from infra.embedded import free_port
from tests.e2e.conftest import ADMIN_KEY, RunningStack, assert_replay_equals_live, start_stack, stop_stack
from tests.factories import chat_line, upload_when_key_known, wait_for_progress, wait_until_done

pytestmark = pytest.mark.e2e

PRICE = ModelPrice(input_per_mtok_usd=Decimal("100"), cached_input_per_mtok_usd=Decimal("50"),
                   output_per_mtok_usd=Decimal("1000"), batch_minimum_usd=Decimal("0.001"))
ORG = "default"  # the admin key has no user: its batches bill the default organisation


@pytest.fixture(scope="module")
def billed_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    root = tmp_path_factory.mktemp("billed")
    catalogue = (Path(__file__).parents[2] / "infra" / "catalogue.toml").read_text()
    priced = catalogue.replace(
        'price = { input_per_mtok_usd = "0.05", cached_input_per_mtok_usd = "0.025", output_per_mtok_usd = "0.20", '
        'batch_minimum_usd = "0.001" }',
        'price = { input_per_mtok_usd = "100", cached_input_per_mtok_usd = "50", output_per_mtok_usd = "1000", '
        'batch_minimum_usd = "0.001" }')
    assert priced != catalogue, "the test's price replaces the catalogue's"
    (root / "catalogue.toml").write_text(priced)
    running = start_stack(root / "data", free_port(), {
        "SHESHNAG_GATEWAY_BILLING": "true", "SHESHNAG_CATALOGUE_PATH": str(root / "catalogue.toml"),
        "SHESHNAG_GATEWAY_CREDIT_SWEEP_INTERVAL_S": "0.5"})
    yield running
    stop_stack(running)


def api(stack: RunningStack, method: str, path: str, **kwargs: Any) -> httpx2.Response:
    return httpx2.request(method, f"{stack.base_url}{path}", headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                          timeout=60, **kwargs)


def balance(stack: RunningStack) -> dict[str, Any]:
    answer = api(stack, "GET", "/billing/balance")
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def micros(amount: str) -> int:
    value = parse_usd(amount)
    assert value is not None
    return value


def grant(stack: RunningStack, amount_usd: str) -> None:
    before = balance(stack)["granted_usd"]
    answer = api(stack, "POST", "/billing/grants", json={"organization_id": ORG, "amount_usd": amount_usd})
    assert answer.status_code == 200, answer.text
    deadline = time.monotonic() + 10
    while balance(stack)["granted_usd"] == before:
        assert time.monotonic() < deadline, "the ledger did not show the grant"
        time.sleep(0.1)


def settle(stack: RunningStack) -> dict[str, Any]:
    """The balance once no reservation is open any more (the ledger folded every batch's end)."""
    deadline = time.monotonic() + 30
    while (shown := balance(stack))["open_batches"]:
        assert time.monotonic() < deadline, shown
        time.sleep(0.2)
    return shown


def cost(usage: Any) -> int:
    cached = usage.input_tokens_details.cached_tokens if usage.input_tokens_details else 0
    return max(PRICE.cost_micros(usage.input_tokens, usage.output_tokens, cached), PRICE.minimum_micros)


def lines(prefix: str, count: int, max_tokens: int = 8) -> list[dict[str, Any]]:
    return [chat_line(f"{prefix}-{i}", f"Count from {i} to {i + 5}.", max_tokens=max_tokens) for i in range(count)]


def test_a_batch_is_quoted_refused_without_credit_then_reserved_debited_its_usage_and_refunded_the_rest(
        billed_stack: RunningStack) -> None:
    client = billed_stack.client()
    file_id = upload_when_key_known(client, lines("q", 3))
    quote = api(billed_stack, "POST", "/batches/quote", json={"input_file_id": file_id})
    assert quote.status_code == 200, quote.text
    quoted = quote.json()
    assert quoted["billing_enabled"] and quoted["lines"] == 3 and quoted["model"] == "smollm2-135m-instruct-q4_1"
    assert quoted["output_tokens_max"] == 3 * 8 and not quoted["fits_balance"]
    worst = micros(quoted["price"]["max_usd"])
    assert micros(quoted["price"]["min_usd"]) <= micros(quoted["price"]["estimate_usd"]) <= worst

    with pytest.raises(openai.APIStatusError) as refused:
        client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    assert refused.value.status_code == 402 and refused.value.body["code"] == "insufficient_balance"  # type: ignore[index]

    grant(billed_stack, "5")
    with pytest.raises(openai.APIStatusError) as above:
        client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h",
                              metadata={"max_price_usd": "0.000001"})
    assert above.value.status_code == 402 and above.value.body["code"] == "price_above_max"  # type: ignore[index]
    assert balance(billed_stack)["reserved_usd"] == "0.000000"

    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h",
                                  metadata={"max_price_usd": "3"})
    held = balance(billed_stack)
    assert micros(held["reserved_usd"]) == worst and micros(held["available_usd"]) == 5_000_000 - worst
    done, _ = wait_until_done(client, batch.id)
    assert done.status == "completed" and done.usage is not None and done.usage.output_tokens > 0
    shown = settle(billed_stack)
    charged = cost(done.usage)
    assert charged > PRICE.minimum_micros, "tokens, not the minimum, make this batch's price"
    assert micros(shown["balance_usd"]) == 5_000_000 - charged and shown["reserved_usd"] == "0.000000"
    assert micros(shown["debited_usd"]) == charged
    last = shown["last_event"]
    assert last["type"] == "refund" and last["endpoint"] == "/v1/chat/completions:batch"
    assert micros(last["amount_usd"]) == worst - charged and last["batch_id"] == batch.id


def test_credit_taken_back_mid_batch_ends_its_unrun_lines_insufficient_credits(billed_stack: RunningStack) -> None:
    client = billed_stack.client()
    grant(billed_stack, "5")
    ids = [f"short-{i}" for i in range(40)]
    file_id = upload_when_key_known(client, [chat_line(i, f"Write a long story about {i}.", max_tokens=64)
                                             for i in ids])
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    wait_for_progress(client, batch.id)
    owed = micros(balance(billed_stack)["balance_usd"])
    grant(billed_stack, f"-{Decimal(owed + 1) / 1_000_000}")  # the balance falls below zero
    done, _ = wait_until_done(client, batch.id)
    assert done.status == "cancelled" and done.error_file_id, done.model_dump()
    assert done.errors is not None and any(e.code == "insufficient_credits" for e in done.errors.data or [])
    errors = [json.loads(row) for row in client.files.content(done.error_file_id).text.splitlines()]
    assert errors and {row["error"]["code"] for row in errors} == {"insufficient_credits"}
    assert all(row["response"] is None for row in errors)
    output = client.files.content(done.output_file_id).text.splitlines() if done.output_file_id else []
    assert len(output) + len(errors) == len(ids)
    shown = settle(billed_stack)
    assert shown["last_event"]["batch_id"] == batch.id


def kill_ledger(stack: RunningStack) -> None:
    pid = stack.service_pid("ledger")
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while stack.service_pid("ledger") == pid:
        assert time.monotonic() < deadline, "the ledger was not restarted"
        time.sleep(0.1)


def test_a_ledger_killed_mid_batch_debits_each_chunk_once_and_a_replay_gives_the_live_balances(
        billed_stack: RunningStack) -> None:
    client = billed_stack.client().with_options(max_retries=5)
    grant(billed_stack, "5")
    before = micros(settle(billed_stack)["balance_usd"])
    file_id = upload_when_key_known(client, lines("kill", 24, max_tokens=24))
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    wait_for_progress(client, batch.id)
    kill_ledger(billed_stack)
    done, _ = wait_until_done(client, batch.id)
    assert done.status == "completed" and done.usage is not None
    assert micros(settle(billed_stack)["balance_usd"]) == before - cost(done.usage)

    assert_replay_equals_live(billed_stack)


def test_the_operator_cli_grants_credit_and_shows_the_balance(billed_stack: RunningStack) -> None:
    connection, _ = embedded_settings(billed_stack.data_dir, billed_stack.nats_port, billed_stack.s3_port)
    env = dict(os.environ, SHESHNAG_NATS_URL=connection.nats_url)
    before = micros(balance(billed_stack)["granted_usd"])
    granted = subprocess.run([sys.executable, "-m", "infra.cli", "credits", "grant", ORG, "2.5", "--note", "pilot"],
                             capture_output=True, text=True, timeout=120, env=env)
    assert granted.returncode == 0, granted.stderr
    assert "granted 2.500000 USD to default" in granted.stdout
    assert micros(balance(billed_stack)["granted_usd"]) == before + 2_500_000
    shown = subprocess.run([sys.executable, "-m", "infra.cli", "credits", "show", ORG], capture_output=True,
                           text=True, timeout=120, env=env)
    assert shown.returncode == 0 and shown.stdout.startswith("default: balance "), shown.stderr
