"""The archive's object keys and its line format: a fact's payload comes back byte for byte, whatever its bytes."""

import pytest

from contracts.archive import (
    archived_batch_log_key,
    fact_line,
    index_of,
    parse_fact_line,
    segment_key,
    snapshot_key,
)


def test_the_archive_keys_name_their_index_and_batch() -> None:
    assert segment_key(3) == "ledger-archive/segments/00000003.jsonl.gz" and index_of(segment_key(3)) == 3
    assert snapshot_key(12) == "ledger-archive/snapshots/00000012.jsonl.gz" and index_of(snapshot_key(12)) == 12
    assert archived_batch_log_key("batch_x") == "ledger-archive/batches/batch_x.jsonl.gz"


@pytest.mark.parametrize("data", [b'{"note":"caf\xc3\xa9 \\n\t\x00"}', b"\xff\xfe not UTF-8", b""])
def test_an_archived_fact_reads_back_with_the_exact_bytes_it_was_stored_with(data: bytes) -> None:
    line = fact_line(42, "evt.batch.batch_1.created", data)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert parse_fact_line(line.rstrip(b"\n")) == (42, "evt.batch.batch_1.created", data)
