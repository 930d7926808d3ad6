"""`sheshnag backup` of a running stack, `sheshnag restore` into a new data dir: every batch and file is back with
its status and counts, output files download with the same SHA-256, and the ledger's replay equals live."""

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from openai import OpenAI

from infra.embedded import free_port
from tests.e2e.conftest import assert_replay_equals_live, start_stack, stop_stack
from tests.factories import chat_line, jsonl, upload_when_key_known, wait_until_done

pytestmark = pytest.mark.e2e


def sheshnag(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "infra.cli", *args], capture_output=True, text=True, timeout=300)


def contents(client: OpenAI) -> tuple[dict[str, dict[str, object]], dict[str, dict[str, object]], dict[str, str]]:
    """Every batch and file as the API shows them, and the SHA-256 of every file's bytes."""
    batches = {batch.id: batch.model_dump() for batch in client.batches.list()}
    files = {file.id: file.model_dump() for file in client.files.list()}
    digests = {file_id: hashlib.sha256(client.files.content(file_id).read()).hexdigest() for file_id in files}
    return batches, files, digests


def test_a_restored_data_dir_holds_every_batch_and_file_with_the_same_bytes_and_replay_equals_live(
        tmp_path: Path) -> None:
    live = start_stack(tmp_path / "data", free_port())
    try:
        client = live.client()
        created = [client.batches.create(
            input_file_id=upload_when_key_known(client, [chat_line(f"{name}-{i}", f"Say {i}.", max_tokens=8)
                                                         for i in range(2)]),
            endpoint="/v1/chat/completions", completion_window="24h") for name in ("first", "second")]
        for batch in created:  # both run at once: the second no longer waits for the first to end
            assert wait_until_done(client, batch.id, timeout_s=180)[0].status == "completed"
        client.files.create(file=jsonl([chat_line("kept", "hi")], name="kept.jsonl"), purpose="batch")
        before = contents(client)
        backed_up = sheshnag("backup", str(tmp_path / "backup"), "--data-dir", str(live.data_dir),
                             "--nats-port", str(live.nats_port), "--s3-port", str(live.s3_port))
        assert backed_up.returncode == 0, backed_up.stderr
    finally:
        stop_stack(live)
    print(f"\n{backed_up.stdout.strip()}")

    restored = sheshnag("restore", str(tmp_path / "backup"), "--data-dir", str(tmp_path / "restored"))
    assert restored.returncode == 0, restored.stderr
    refused = sheshnag("restore", str(tmp_path / "backup"), "--data-dir", str(tmp_path / "restored"))
    assert refused.returncode == 1 and "not empty" in refused.stderr

    again = start_stack(tmp_path / "restored", free_port())
    try:
        batches, files, digests = contents(again.client())
        assert (batches, files, digests) == before
        assert sum(1 for batch in batches.values() if batch["output_file_id"]) == 2
        assert_replay_equals_live(again)  # its executor registers again as it comes up: compared until still
    finally:
        stop_stack(again)
