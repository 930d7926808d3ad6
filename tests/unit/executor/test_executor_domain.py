"""The executor's pure logic: result lines, chunk bookkeeping, resuming, assembling files, usage, the
invariant of terminal batches and what a batch's log says about its attempts."""

import json
from typing import TypeVar, cast

import pytest

from contracts.api.output_line import decode_chunk
from contracts.api.rejected_line import RejectedLine
from contracts.events.batch import (
    AttemptFailed,
    BatchAssigned,
    BatchCancelRequested,
    BatchCreated,
    BatchFailed,
    BatchFinalizing,
)
from contracts.events.envelope import Event
from contracts.ids import batch_request_id
from contracts.objects import MAX_CHUNK_BYTES
from services.executor.attempts import BatchLog
from services.executor.chunk_lines import StoredLine, encode_chunk, output_json, read_chunk
from services.executor.domain import (
    ChunkCommitter,
    CommittedLine,
    InputLine,
    InvalidInputLine,
    Resume,
    Tally,
    assemble,
    chunk_position,
    finished_line,
    parse_input_line,
    refused_line,
    result_line,
    unrun_line,
    usage_of,
)
from tests.batch_invariant import InvariantBroken, check_invariant

BATCH = "batch_unit"
E = TypeVar("E", bound=Event)


def completion(prompt: int, completion: int, cached: int | None = None) -> dict[str, object]:
    usage: dict[str, object] = {"prompt_tokens": prompt, "completion_tokens": completion,
                                "total_tokens": prompt + completion}
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return {"object": "chat.completion", "model": "smollm2-135m-instruct-q4_1", "usage": usage,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}]}


def too_long() -> dict[str, object]:
    return {"error": {"message": "request exceeds the context", "type": "invalid_request_error",
                      "param": None, "code": "exceed_context_size_error"}}


def ok(line: int, custom_id: str, prompt: int = 10, completed: int = 4) -> CommittedLine:
    return result_line(BATCH, InputLine(line, custom_id, {}), 200, completion(prompt, completed))


def failed(line: int, custom_id: str) -> CommittedLine:
    return result_line(BATCH, InputLine(line, custom_id, {}), 400, too_long())


def test_a_successful_line_has_openais_batch_output_shape() -> None:
    output = json.loads(ok(1, "req-1").output.model_dump_json())
    assert output["id"] == batch_request_id(BATCH, "req-1")
    assert output["custom_id"] == "req-1"
    assert output["error"] is None
    assert output["response"]["status_code"] == 200
    assert output["response"]["request_id"].startswith("req_")
    assert output["response"]["body"]["usage"]["prompt_tokens"] == 10


def test_the_request_id_is_stable_across_attempts() -> None:
    assert ok(1, "a").output.response == ok(1, "a").output.response


def test_an_engine_error_becomes_an_error_line_with_its_status_and_body() -> None:
    line = failed(2, "too-long")
    assert not line.succeeded
    assert line.output.response is not None
    assert line.output.response.status_code == 400
    assert line.output.response.body["error"] == too_long()["error"]


def test_blank_lines_are_skipped_and_line_numbers_are_kept() -> None:
    assert parse_input_line(3, b"  ") is None
    parsed = parse_input_line(4, b'{"custom_id": "x", "method": "POST", "body": {"max_tokens": 2}}')
    assert parsed == InputLine(4, "x", {"max_tokens": 2})


def test_a_line_without_custom_id_is_not_what_was_validated() -> None:
    with pytest.raises(InvalidInputLine, match="line 7"):
        parse_input_line(7, b'{"body": {}}')


def test_chunks_are_cut_every_chunk_lines_with_cumulative_counts() -> None:
    committer = ChunkCommitter(chunk_lines=2, next_chunk=3, tally=Tally(completed=5, failed=1))
    assert committer.add(ok(1, "a")) is None
    first = committer.add(failed(2, "b"))
    assert first is not None and (first.number, first.completed, first.failed) == (3, 6, 2)
    assert committer.add(ok(3, "c")) is None
    last = committer.flush()
    assert last is not None and (last.number, last.completed, last.failed) == (4, 7, 2)
    assert committer.flush() is None


def test_no_chunk_follows_one_that_was_not_written() -> None:
    """Its lines are in the tally: a later chunk would state counts no chunk holds."""
    committer = ChunkCommitter(chunk_lines=1, next_chunk=0, tally=Tally())
    assert committer.add(ok(1, "a")) is not None
    committer.unwritten = OSError("the object store is restarting")
    with pytest.raises(OSError, match="restarting"):
        committer.add(ok(2, "b"))
    with pytest.raises(OSError, match="restarting"):
        committer.flush()


def test_a_chunk_whose_first_line_waited_long_enough_is_committed_short() -> None:
    committer = ChunkCommitter(chunk_lines=16, next_chunk=0, tally=Tally(), max_wait_s=2.0)
    assert committer.add(ok(1, "a"), now=10.0) is None
    assert committer.add(ok(2, "b"), now=11.9) is None
    short = committer.add(ok(3, "c"), now=12.0)
    assert short is not None and len(short.lines) == 3 and short.completed == 3
    assert committer.add(ok(4, "d"), now=12.5) is None  # the next chunk's wait starts with its own first line


def test_lines_whose_outputs_pass_the_byte_bound_are_committed_at_once_however_few() -> None:
    one_line = len(output_json(ok(1, "a")))
    committer = ChunkCommitter(chunk_lines=256, next_chunk=0, tally=Tally(), max_bytes=2 * one_line)
    assert committer.add(ok(1, "a")) is None
    big = committer.add(ok(2, "b"))
    assert big is not None and [line.line for line in big.lines] == [1, 2]
    assert committer.add(ok(3, "c")) is None  # the count starts again with the next chunk


def test_the_byte_bound_keeps_a_chunk_far_below_what_is_read_back() -> None:
    assert ChunkCommitter(chunk_lines=1, next_chunk=0, tally=Tally()).max_bytes * 2 <= MAX_CHUNK_BYTES


def test_resuming_skips_lines_any_attempt_committed() -> None:
    chunks = [
        ("results/b/attempt-1/chunk-000000.jsonl", [ok(1, "a"), failed(3, "c")]),
        ("results/b/attempt-2/chunk-000000.jsonl", [ok(2, "b")]),
    ]
    resume = Resume.from_chunks(chunks, attempt=3)
    assert set(resume.committed) == {1, 2, 3}
    assert (resume.next_chunk, resume.last_chunk) == (0, None)
    assert resume.tally() == Tally(completed=2, failed=1)


def test_a_redelivered_attempt_numbers_its_chunks_after_its_own_committed_ones() -> None:
    chunks = [(f"results/b/attempt-2/chunk-{n:06d}.jsonl", [ok(n + 1, f"id{n}")]) for n in range(3)]
    resume = Resume.from_chunks(chunks, attempt=2)
    assert (resume.next_chunk, resume.last_chunk) == (3, 2)


def test_the_earliest_commit_of_a_line_wins_whatever_the_listing_order() -> None:
    later = result_line(BATCH, InputLine(1, "a", {}), 200, completion(99, 99))
    chunks = [("results/b/attempt-10/chunk-000000.jsonl", [later]),
              ("results/b/attempt-2/chunk-000000.jsonl", [ok(1, "a")])]
    assert Resume.from_chunks(chunks, attempt=11).committed[1] == ok(1, "a")


def test_a_refused_repeat_of_a_custom_id_does_not_stand_for_the_line_that_used_it_first() -> None:
    # allow_partial with lines A, B, A, C: validation refused line 3; line 1 must still run.
    repeat = refused_line(BATCH, RejectedLine(line=3, custom_id="A", code="duplicate_custom_id", message="again"))
    resume = Resume.from_chunks([("results/b/attempt-0/chunk-000000.jsonl", [repeat])], attempt=1)
    assert set(resume.committed) == {3}
    files = assemble([ok(1, "A"), ok(2, "B"), repeat, ok(4, "C")])
    assert [json.loads(row)["custom_id"] for row in files.output.splitlines()] == ["A", "B", "C"]
    assert [json.loads(row)["custom_id"] for row in files.errors.splitlines()] == ["A"]
    check_invariant(4, 3, 1, files.output, files.errors)


def test_a_line_nested_as_deep_as_orjson_parses_is_read_without_recursion_errors() -> None:
    deep = b"[" * 1000 + b"]" * 1000
    parsed = parse_input_line(1, b'{"custom_id": "x", "body": {"user": ' + deep + b"}}")
    assert parsed is not None and parsed.custom_id == "x"


def test_chunk_keys_are_read_back_numerically() -> None:
    assert chunk_position("results/b/attempt-12/chunk-000105.jsonl") == (12, 105)


def test_chunks_round_trip_through_jsonl() -> None:
    lines = [ok(1, "a"), failed(2, "b")]
    assert decode_chunk(encode_chunk(lines)) == lines


def test_files_hold_successes_and_failures_each_in_input_order() -> None:
    files = assemble([ok(3, "c"), failed(4, "d"), ok(1, "a"), failed(2, "b")])
    assert [json.loads(row)["custom_id"] for row in files.output.splitlines()] == ["a", "c"]
    assert [json.loads(row)["custom_id"] for row in files.errors.splitlines()] == ["b", "d"]
    assert (files.output_lines, files.error_lines) == (2, 2)


def test_a_batch_without_failures_has_an_empty_error_file() -> None:
    files = assemble([ok(1, "a")])
    assert files.errors == b"" and files.error_lines == 0


def test_usage_sums_successful_bodies_including_cached_tokens() -> None:
    cached = result_line(BATCH, InputLine(3, "c", {}), 200, completion(20, 5, cached=8))
    usage = usage_of([ok(1, "a", 10, 4), failed(2, "b"), cached])
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (30, 9, 39)
    assert usage.input_tokens_details.cached_tokens == 8


def test_a_line_that_never_ran_is_an_error_line_without_a_response() -> None:
    output = json.loads(unrun_line(BATCH, InputLine(5, "e", {}), "batch_cancelled", "cancelled").output
                        .model_dump_json())
    assert output == {"id": batch_request_id(BATCH, "e"), "custom_id": "e", "response": None,
                      "error": {"code": "batch_cancelled", "message": "cancelled"}}


def test_usage_counts_embeddings_prompt_tokens_and_responses_input_and_output_tokens() -> None:
    embedding = result_line(BATCH, InputLine(1, "a", {}), 200, {"object": "list", "data": [],
                                                                 "usage": {"prompt_tokens": 6, "total_tokens": 6}})
    response = result_line(BATCH, InputLine(2, "b", {}), 200, {"object": "response", "usage": {
        "input_tokens": 9, "output_tokens": 4, "total_tokens": 13, "input_tokens_details": {"cached_tokens": 2}}})
    usage = usage_of([embedding, response])
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (15, 4, 19)
    assert usage.input_tokens_details.cached_tokens == 2


def test_the_invariant_holds_when_every_line_is_in_exactly_one_file() -> None:
    files = assemble([ok(1, "a"), failed(2, "b"), unrun_line(BATCH, InputLine(3, "c", {}), "batch_expired", "x")])
    check_invariant(3, 1, 2, files.output, files.errors)


def test_the_invariant_catches_a_missing_line_a_duplicate_and_wrong_counts() -> None:
    files = assemble([ok(1, "a"), failed(2, "a")])
    twice = assemble([ok(1, "a"), ok(1, "a")])
    with pytest.raises(InvariantBroken, match="more than once"):
        check_invariant(2, 2, 0, twice.output, twice.errors)
    with pytest.raises(InvariantBroken, match="3 input lines"):
        check_invariant(3, 1, 2, assemble([ok(1, "a"), failed(2, "b")]).output, files.errors)
    with pytest.raises(InvariantBroken, match="completed"):
        check_invariant(2, 2, 0, files.output, files.errors)


def fact(model: type[E], **fields: object) -> E:
    return model.model_validate({"aggregate_id": BATCH, **fields})


def test_an_attempt_is_fenced_off_once_it_failed_or_a_later_one_was_assigned() -> None:
    log = BatchLog()
    log.fold(fact(BatchAssigned, executor_id="x", attempt=1, lease_token="t1"))
    assert log.is_current(1) and log.live_attempt() == 1
    log.fold(fact(AttemptFailed, attempt=1, executor_id="x", code="executor_lost", reason="gone"))
    assert not log.is_current(1) and log.live_attempt() is None
    log.fold(fact(BatchAssigned, executor_id="y", attempt=2, lease_token="t2"))
    assert log.live_attempt() == 2 and not log.is_current(1) and log.is_current(2)
    log.fold(fact(BatchFailed, code="c", reason="r"))
    assert log.ended == "batch.failed" and log.live_attempt() is None


def test_a_batch_stops_on_cancel_or_once_its_window_ends() -> None:
    log = BatchLog()
    log.fold(fact(BatchCreated, owner_key_id="k", input_file_id="f", input_object_key="o",
                  endpoint="/v1/chat/completions", completion_window="24h", created_at=100, expires_at=200))
    assert log.stop_reason(now_s=199) is None and log.stop_reason(now_s=200) == "expired"
    log.fold(fact(BatchCancelRequested, requested_by_key_id="k"))
    assert log.stop_reason(now_s=0) == "cancelled"


def test_a_cancel_before_the_first_finalizing_fact_ends_the_batch_cancelled_whoever_finalizes_it() -> None:
    log = BatchLog()
    log.fold(fact(BatchCancelRequested, requested_by_key_id="k", code="authorization_revoked"), 5)
    log.fold(fact(BatchFinalizing, attempt=1), 6)
    assert log.outcome("completed") == log.outcome("cancelled") == "cancelled"
    assert log.cancel_code == "authorization_revoked" and log.stop_reason(now_s=0) == "cancelled"


def test_a_cancel_after_the_first_finalizing_fact_is_too_late_and_the_batch_completes() -> None:
    log = BatchLog()
    log.fold(fact(BatchFinalizing, attempt=1), 5)
    log.fold(fact(BatchCancelRequested, requested_by_key_id="k"), 6)
    assert log.outcome("completed") == log.outcome("cancelled") == "completed"
    assert log.stop_reason(now_s=0) is None


def test_an_expiry_asked_after_the_finalizing_fact_ends_the_batch_as_the_finalizing_decided() -> None:
    finished = BatchLog()
    finished.fold(fact(BatchFinalizing, attempt=1), 5)
    cancelled = BatchLog()
    cancelled.fold(fact(BatchCancelRequested, requested_by_key_id="k"), 5)
    cancelled.fold(fact(BatchFinalizing, attempt=1), 6)
    assert finished.outcome("expired") == "completed" and cancelled.outcome("expired") == "cancelled"
    assert finished.outcome("failed") == "failed"


def test_an_accepted_cancel_ends_the_batch_cancelled_whatever_its_finalizer_was_asked() -> None:
    log = BatchLog()
    log.fold(fact(BatchCancelRequested, requested_by_key_id="k"), 5)
    assert [log.outcome(asked) for asked in ("cancelled", "expired", "failed")] == ["cancelled"] * 3


def test_without_a_cancel_or_a_finalizing_fact_a_batch_ends_as_its_finalizer_was_asked() -> None:
    log = BatchLog()
    assert [log.outcome(asked) for asked in ("completed", "expired", "failed")] == ["completed", "expired", "failed"]


def test_pending_lines_fall_due_by_the_clock_alone() -> None:
    committer = ChunkCommitter(chunk_lines=16, next_chunk=0, tally=Tally(), max_wait_s=2.0)
    assert not committer.due(100.0)  # nothing pending
    assert committer.add(ok(1, "a"), now=10.0) is None
    assert not committer.due(11.9)
    assert committer.due(12.0)
    chunk = committer.flush()
    assert chunk is not None and chunk.completed == 1 and not committer.due(50.0)


def test_chunk_and_file_lines_are_the_bytes_the_models_write_and_read_back_as_they_are() -> None:
    """orjson writes what the models write, for every kind of line and every JSON value a body holds; a chunk line
    read back gives the same output line bytes, usage and outcome as the models would decode it to."""
    bodies: list[dict[str, object]] = [
        completion(10, 4, cached=3), too_long(),
        {"x": [0.1, 1e16, 1e-7, -0.0, 5e-324, 1.7976931348623157e308, 2**63 - 1, -(2**63), 2**64 - 1],
         "s": "é漢字🎉 \u2028\x00\x1f\x7f \"quoted\" \\ / <&>", "n": None, "b": [True, False], "nested": {"": {}}},
        {"nan": float("nan"), "inf": float("inf"), "t": (1, 2)},  # as the models write them: null, null, [1, 2]
        {"big": 2**70, "set": {1}}, {"usage": {"input_tokens": 9, "output_tokens": 4}},  # the models' way
    ]
    lines = [result_line(BATCH, InputLine(n, f"c-{n}", {}), status, body)
             for n, body in enumerate(bodies, 1) for status in (200, 400, 500)]
    lines += [unrun_line(BATCH, InputLine(99, "u", {}), "batch_expired", "never ran"),
              refused_line(BATCH, RejectedLine(line=7, custom_id=None, code="invalid_json", message="bad"))]
    chunk = encode_chunk(lines)
    assert chunk == b"".join(line.model_dump_json().encode() + b"\n" for line in lines)
    read = read_chunk(chunk)
    assert all(isinstance(line, StoredLine) for line in read[:12])  # JSON's own types: kept as their bytes
    assert [line.line for line in read] == [line.line for line in lines]
    assert [line.succeeded for line in read] == [line.succeeded for line in lines]
    assert [output_json(line) for line in read] == [line.output.model_dump_json().encode() for line in lines]
    assert usage_of(read) == usage_of(lines)
    files = assemble(read)
    assert files == assemble(decode_chunk(chunk))
    assert files.output == b"".join(line.output.model_dump_json().encode() + b"\n"
                                    for line in sorted(lines, key=lambda line: line.line) if line.succeeded)


def test_a_chunk_line_not_as_the_models_write_it_is_decoded_by_them() -> None:
    """Spacing, another key order, an extra key, a number orjson reads otherwise, a string where an integer goes:
    each line is what the models make of it, and one they refuse is refused."""
    written = ok(1, "a").model_dump_json()
    variants = [json.dumps(json.loads(written)), written.replace('"status_code":200', '"status_code":"200"'),
                written.replace('{"line":1,', '{"extra":1,"line":1,'),
                written.replace('"prompt_tokens":10', '"prompt_tokens":18446744073709551616')]
    for raw in variants:
        (line,) = read_chunk(raw.encode())
        model = CommittedLine.model_validate_json(raw)
        assert output_json(line) == model.output.model_dump_json().encode() and line.succeeded == model.succeeded
        assert usage_of([line]) == usage_of([model])
    with pytest.raises(ValueError):
        read_chunk(b'{"line":1,"custom_id":"a","output":{"id":3}}\n')


def test_a_finished_line_as_the_runner_keeps_it_is_the_result_line_byte_for_byte() -> None:
    bodies: list[dict[str, object]] = [completion(10, 4, cached=3), too_long(), {"x": [0.1, 1e16, "é\u2028"]},
                                       {"big": 2**70}, {"t": (1, 2), "nan": float("nan")}, {"set": {1}}]
    made = [(result_line(BATCH, InputLine(n, f"c-{n}", {}), status, body),
             finished_line(BATCH, InputLine(n, f"c-{n}", {}), status, body))
            for n, body in enumerate(bodies, 1) for status in (200, 404, 503)]
    assert encode_chunk([model for model, _ in made]) == encode_chunk([kept for _, kept in made])
    for model, kept in made:
        assert output_json(kept) == model.output.model_dump_json().encode()
        assert (kept.line, kept.custom_id, kept.succeeded) == (model.line, model.custom_id, model.succeeded)
        assert usage_of([kept]) == usage_of([model])
    assert isinstance(made[0][1], StoredLine) and isinstance(made[9][1], CommittedLine)  # 2**70: the model's way
    with pytest.raises(ValueError):  # a body the models refuse is refused as before
        finished_line(BATCH, InputLine(1, "a", {}), 200, cast(dict[str, object], {1: "not a string key"}))
