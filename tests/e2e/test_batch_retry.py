"""`POST /v1/batches/{id}/retry` against a real stack: the lines a cancelled batch never ran go into a new batch of
their own, linked to the first, and complete; `codes` picks lines by why they failed; a batch not ended, or with no
failed line, says so."""

import json
from typing import Any

import httpx2
import pytest
from openai import OpenAI

from tests.e2e.conftest import ADMIN_KEY, RunningStack
from tests.factories import chat_line, upload, wait_until_done

pytestmark = pytest.mark.e2e


def retry(stack: RunningStack, batch_id: str, **body: Any) -> httpx2.Response:
    return httpx2.post(f"{stack.base_url}/batches/{batch_id}/retry", json=body,
                       headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=60)


def error_rows(client: OpenAI, file_id: str) -> list[dict[str, Any]]:
    return [json.loads(row) for row in client.files.content(file_id).text.splitlines()]


def test_the_lines_a_cancelled_batch_never_ran_are_retried_in_a_linked_batch(stack: RunningStack) -> None:
    client = stack.client()
    ids = [f"retry-{n}" for n in range(12)]
    file_id = upload(client, [chat_line(i, f"Write about {i}.", max_tokens=48) for i in ids])
    first = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h",
                                  metadata={"team": "retry"})
    early = retry(stack, first.id)
    assert early.status_code == 409 and early.json()["error"]["code"] == "batch_not_ended"
    client.batches.cancel(first.id)
    ended, _ = wait_until_done(client, first.id)
    assert ended.status == "cancelled" and ended.error_file_id and ended.request_counts is not None
    never_ran = {row["custom_id"] for row in error_rows(client, ended.error_file_id)}
    assert never_ran and never_ran <= set(ids)

    answer = retry(stack, first.id)
    assert answer.status_code == 200, answer.text
    second = answer.json()
    assert second["metadata"] == {"team": "retry", "retry_of": first.id} and second["id"] != first.id
    assert retry(stack, first.id).json()["id"] == second["id"]  # the same retry asked again is the same batch
    done, _ = wait_until_done(client, second["id"])
    assert done.status == "completed" and done.request_counts is not None
    assert done.request_counts.total == len(never_ran) and done.request_counts.completed == len(never_ran)
    assert done.output_file_id is not None
    rerun = {json.loads(row)["custom_id"] for row in client.files.content(done.output_file_id).text.splitlines()}
    assert rerun == never_ran


def test_codes_pick_the_lines_to_retry_and_a_batch_without_failures_has_none(stack: RunningStack) -> None:
    client = stack.client()
    file_id = upload(client, [chat_line("fine-1", "Hi.", max_tokens=2), b'{"custom_id": "broken"',
                              chat_line("fine-2", "Yo.", max_tokens=2)])
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h",
                                  extra_body={"allow_partial": True})
    done, _ = wait_until_done(client, batch.id)
    assert done.status == "completed" and done.request_counts is not None and done.request_counts.failed == 1
    nothing = retry(stack, batch.id)  # the refused line would be refused again: not retried unless asked
    assert nothing.status_code == 409 and nothing.json()["error"]["code"] == "nothing_to_retry"
    asked = retry(stack, batch.id, codes=["invalid_json"], allow_partial=True)
    assert asked.status_code == 200, asked.text
    again, _ = wait_until_done(client, asked.json()["id"])
    assert again.request_counts is not None and again.request_counts.total == 1

    clean_file = upload(client, [chat_line("clean", "Hello.", max_tokens=2)])
    clean = client.batches.create(input_file_id=clean_file, endpoint="/v1/chat/completions", completion_window="24h")
    wait_until_done(client, clean.id)
    none = retry(stack, clean.id)
    assert none.status_code == 409 and none.json()["error"]["code"] == "nothing_to_retry"
