"""Our API objects against OpenAI's published schemas (vendored in openai_schemas.json)."""

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from contracts.api.batch import Batch, BatchError, BatchErrors, RequestCounts
from contracts.api.error import ErrorBody
from contracts.api.file import FileDeleted, FileObject
from contracts.api.model import Model

SCHEMAS: dict[str, Any] = json.loads(Path(__file__).with_name("openai_schemas.json").read_text())

SAMPLES: dict[str, BaseModel] = {
    "Batch": Batch(id="batch_1", endpoint="/v1/chat/completions", input_file_id="file-1", completion_window="24h",
                   status="completed", created_at=1, errors=BatchErrors(data=[BatchError(code="x", message="m")])),
    "BatchError": BatchError(code="invalid_json", line=3, message="bad", param=None),
    "BatchRequestCounts": RequestCounts(total=3, completed=2, failed=1),
    "OpenAIFile": FileObject(id="file-1", bytes=10, created_at=1, filename="a.jsonl", purpose="batch"),
    "Model": Model(id="m", created=0, owned_by="me"),
    "Error": ErrorBody(message="m", type="invalid_request_error", param=None, code=None),
    "DeleteFileResponse": FileDeleted(id="file-1", deleted=True),
}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_every_required_openai_field_is_present(name: str) -> None:
    dumped = SAMPLES[name].model_dump(mode="json")
    missing = set(SCHEMAS[name].get("required", [])) - set(dumped)
    assert not missing, f"{name} lacks {missing}"


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_every_field_openai_declares_has_the_declared_json_type(name: str) -> None:
    dumped = SAMPLES[name].model_dump(mode="json")
    for field, schema in SCHEMAS[name].get("properties", {}).items():
        if dumped.get(field) is None or "type" not in schema:
            continue
        expected = {"string": str, "integer": int, "boolean": bool, "object": dict, "array": list}[schema["type"]]
        assert isinstance(dumped[field], expected), f"{name}.{field} is {dumped[field]!r}"


def test_batch_statuses_are_openais_plus_validated() -> None:
    openai_statuses = set(SCHEMAS["Batch"]["properties"]["status"]["enum"])
    ours = set(Batch.model_json_schema()["properties"]["status"]["enum"])
    assert ours - openai_statuses == {"validated"}
    assert openai_statuses <= ours


def test_file_purposes_cover_batch_and_batch_output() -> None:
    ours = set(FileObject.model_json_schema()["properties"]["purpose"]["enum"])
    assert {"batch", "batch_output"} <= ours
