"""Webhooks on a whole stack: a batch run through the OpenAI SDK tells a registered endpoint it was validated and
then completed, each POST verified with the `standardwebhooks` library, and the deliveries list shows each one
delivered at its first attempt."""

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx2
import pytest
from standardwebhooks.webhooks import Webhook

from tests.e2e.conftest import ADMIN_KEY, RunningStack
from tests.factories import chat_line, upload, wait_until_done

pytestmark = pytest.mark.e2e
Received = list[tuple[dict[str, str], bytes]]


@pytest.fixture
def receiver() -> Iterator[tuple[str, Received]]:
    received: Received = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            received.append(({k.lower(): v for k, v in self.headers.items()}, body))
            self.send_response(204)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hooks", received
    server.shutdown()
    server.server_close()


def api(stack: RunningStack, method: str, path: str, **kwargs: Any) -> httpx2.Response:
    return httpx2.request(method, f"{stack.base_url}{path}", headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                          timeout=60, **kwargs)


def test_a_batch_tells_its_webhook_it_was_validated_and_completed(stack: RunningStack,
                                                                  receiver: tuple[str, Received]) -> None:
    url, received = receiver
    registered = api(stack, "POST", "/webhooks", json={"url": url, "description": "e2e"})
    assert registered.status_code == 200, registered.text
    endpoint = registered.json()
    client = stack.client()
    batch = client.batches.create(input_file_id=upload(client, [chat_line(f"wh-{n}", "Say hi.", max_tokens=4)
                                                                for n in range(3)]),
                                  endpoint="/v1/chat/completions", completion_window="24h")
    done, _ = wait_until_done(client, batch.id)
    assert done.status == "completed"

    verifier = Webhook(endpoint["secret"])
    deadline = time.monotonic() + 60
    events: list[dict[str, Any]] = []
    wanted = ["batch.completed", "batch.validated"]  # webhooks promise no order (Standard Webhooks, OpenAI)
    while time.monotonic() < deadline:
        events = [verifier.verify(body, headers) for headers, body in list(received)]
        if sorted(e["type"] for e in events if e["data"]["id"] == batch.id) == wanted:
            break
        time.sleep(0.2)
    assert sorted(e["type"] for e in events if e["data"]["id"] == batch.id) == wanted
    assert all(json.loads(body)["object"] == "event" for _, body in received)

    shown = api(stack, "GET", f"/webhooks/{endpoint['id']}/deliveries?limit=100").json()["data"]
    mine = [d for d in shown if d["event"]["data"]["id"] == batch.id]
    assert {d["status"] for d in mine} == {"delivered"} and len(mine) == 2
    assert all([a["status_code"] for a in d["attempts"]] == [204] for d in mine)
    assert api(stack, "DELETE", f"/webhooks/{endpoint['id']}").status_code == 200
