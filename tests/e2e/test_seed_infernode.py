"""The InferNode seed's walkthroughs, run as written with only the base URL, key and model changed: the four steps
over plain HTTP (upload, create, check, download) for chat and for vectors, the same with the OpenAI SDK, an upload
of the same content returning the file it already had, and a cancel of a finished batch refused with
`batch_not_cancellable`. The scripts check every 30 s; this test every second."""

import io
import json
import time
from typing import Any

import httpx2
import pytest
from openai import OpenAI

from tests.e2e.conftest import ADMIN_KEY, RunningStack

pytestmark = pytest.mark.e2e

CHAT_MODEL, VECTOR_MODEL = "smollm2", "smollm2-embed"  # the seed's "Saptiva Turbo" and "<modelo-de-vectores>"
TERMINAL = {"completed", "failed", "expired", "cancelled"}
ENTRADA = "".join(json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": {
    "model": CHAT_MODEL, "messages": [{"role": "user", "content": question}], "max_tokens": 64}}) + "\n"
    for custom_id, question in (("doc-1", "Resume este expediente en una frase."),
                                ("doc-2", "¿Qué área firma este documento?")))
VECTORES = json.dumps({"custom_id": "parrafo-1", "method": "POST", "url": "/v1/embeddings", "body": {
    "model": VECTOR_MODEL, "input": ["primer párrafo", "segundo párrafo"]}}) + "\n"


def until_ended(http: httpx2.Client, batch_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 240
    while (batch := http.get(f"/batches/{batch_id}").json())["status"] not in TERMINAL:
        assert time.monotonic() < deadline, batch
        time.sleep(1)
    return dict(batch)


@pytest.mark.parametrize(("content", "endpoint"), [(ENTRADA, "/v1/chat/completions"), (VECTORES, "/v1/embeddings")])
def test_the_four_steps_with_plain_http(stack: RunningStack, content: str, endpoint: str) -> None:
    with httpx2.Client(base_url=stack.base_url, headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                       timeout=30) as http:
        # 1. Upload the file: a file-... id.
        uploaded = http.post("/files", data={"purpose": "batch"},
                             files={"file": ("entrada.jsonl", content.encode(), "application/octet-stream")})
        assert uploaded.status_code == 200, uploaded.text
        file_id = uploaded.json()["id"]
        assert file_id.startswith("file-")
        # The same content again is the file already there, and says so.
        again = http.post("/files", data={"purpose": "batch"},
                          files={"file": ("entrada.jsonl", content.encode(), "application/octet-stream")})
        assert again.json()["id"] == file_id and again.headers.get("X-Sheshnag-Deduplicated-From") == file_id
        # 2. Create the batch: a batch_... id, validating (or, when its validation already ended, past it).
        created = http.post("/batches", json={"input_file_id": file_id, "endpoint": endpoint,
                                              "completion_window": "24h"})
        assert created.status_code == 200, created.text
        assert created.json()["id"].startswith("batch_")
        assert created.json()["status"] in ("validating", "validated", "in_progress", "completed")
        # 3. Check until completed, failed, cancelled or expired.
        batch = until_ended(http, created.json()["id"])
        assert batch["status"] == "completed" and batch["error_file_id"] is None, batch
        lines = content.count("\n")
        assert batch["request_counts"] == {"total": lines, "completed": lines, "failed": 0}
        # 4. Download the results with the output_file_id.
        rows = [json.loads(row) for row in http.get(f"/files/{batch['output_file_id']}/content").text.splitlines()]
        assert len(rows) == lines
        for row in rows:
            assert row["id"].startswith("batch_req_") and row["error"] is None
            response = row["response"]
            assert response["status_code"] == 200 and response["request_id"]
            if endpoint == "/v1/embeddings":
                assert [item["index"] for item in response["body"]["data"]] == [0, 1]
            else:
                assert response["body"]["choices"][0]["message"]["content"]
        # A finished batch can no longer be cancelled.
        refused = http.post(f"/batches/{batch['id']}/cancel")
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "batch_not_cancellable"


def test_the_sdk_script(stack: RunningStack) -> None:
    cliente = OpenAI(base_url=stack.base_url, api_key=ADMIN_KEY)
    archivo = cliente.files.create(file=("entrada.jsonl", io.BytesIO(ENTRADA.encode())), purpose="batch")
    lote = cliente.batches.create(input_file_id=archivo.id, endpoint="/v1/chat/completions", completion_window="24h")
    terminales = {"completed", "failed", "expired", "cancelled"}
    deadline = time.monotonic() + 240
    while (lote := cliente.batches.retrieve(lote.id)).status not in terminales:
        assert time.monotonic() < deadline
        time.sleep(1)
    assert lote.status == "completed" and lote.request_counts is not None and lote.request_counts.completed == 2
    assert lote.output_file_id and not lote.error_file_id
    salida = [json.loads(row) for row in cliente.files.content(lote.output_file_id).text.splitlines()]
    assert sorted(row["custom_id"] for row in salida) == ["doc-1", "doc-2"]
