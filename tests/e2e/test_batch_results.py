"""`GET /v1/batches/{id}/results` against a real stack: a client paging while the batch runs collects every output
line once, exactly the output file's, and is told when there is no more to come."""

import json
import time
from typing import Any

import httpx2
import pytest

from tests.e2e.conftest import ADMIN_KEY, RunningStack
from tests.factories import chat_line, upload, wait_until_done

pytestmark = pytest.mark.e2e


def page(stack: RunningStack, batch_id: str, **query: Any) -> httpx2.Response:
    return httpx2.get(f"{stack.base_url}/batches/{batch_id}/results", params=query,
                      headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=60)


def test_paging_results_while_a_batch_runs_collects_its_output_file_line_for_line(stack: RunningStack) -> None:
    client = stack.client()
    ids = [f"res-{n}" for n in range(20)]
    batch = client.batches.create(input_file_id=upload(client, [chat_line(i, f"Tell me about {i}.", max_tokens=24)
                                                                for i in ids]),
                                  endpoint="/v1/chat/completions", completion_window="24h")
    collected: list[dict[str, Any]] = []
    after: str | None = None
    pages = 0
    deadline = time.monotonic() + 240
    while True:
        assert time.monotonic() < deadline, collected
        answer = page(stack, batch.id, limit=5, **({"after": after} if after else {}))
        assert answer.status_code == 200, answer.text
        shown = answer.json()
        assert len(shown["data"]) <= 5
        collected += shown["data"]
        pages += 1
        after = shown["next_after"] or after
        if shown["complete"]:
            break
        if not shown["has_more"]:
            time.sleep(0.3)
    done, _ = wait_until_done(client, batch.id)
    assert done.output_file_id is not None
    output = [json.loads(row) for row in client.files.content(done.output_file_id).text.splitlines()]
    assert sorted(row["id"] for row in collected) == sorted(row["id"] for row in output)
    assert len({row["id"] for row in collected}) == len(collected) == len(ids)
    assert pages >= 4  # 20 lines, 5 a page


def test_a_bad_cursor_or_limit_is_refused_in_openais_shape(stack: RunningStack) -> None:
    client = stack.client()
    batch = client.batches.create(input_file_id=upload(client, [chat_line("one", "Hi.", max_tokens=2)]),
                                  endpoint="/v1/chat/completions", completion_window="24h")
    for query, code in (({"after": "batch_x"}, "invalid_after"), ({"limit": "0"}, "invalid_limit")):
        refused = page(stack, batch.id, **query)
        assert refused.status_code == 400 and refused.json()["error"]["code"] == code
    assert page(stack, "batch_nope").status_code == 404
