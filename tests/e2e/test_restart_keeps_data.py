"""A second `sheshnag up` on the same data dir keeps every file and batch."""

from pathlib import Path

import pytest

from infra.embedded import free_port
from tests.e2e.conftest import start_stack, stop_stack
from tests.factories import chat_line, jsonl, wait_until_done

pytestmark = pytest.mark.e2e


def test_files_and_batches_survive_a_restart(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    first = start_stack(data_dir, free_port())
    try:
        client = first.client()
        uploaded = client.files.create(file=jsonl([chat_line("a", "hi", model="nope")]), purpose="batch")
        created = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                        completion_window="24h")
        before = wait_until_done(client, created.id, timeout_s=60)[0]
    finally:
        stop_stack(first)
    assert first.process.returncode == 0

    second = start_stack(data_dir, free_port())
    try:
        client = second.client()
        assert client.batches.retrieve(created.id).model_dump() == before.model_dump()
        assert client.files.content(uploaded.id).text == jsonl([chat_line("a", "hi", model="nope")]).read().decode()
        assert [b.id for b in client.batches.list()] == [created.id]
    finally:
        stop_stack(second)
