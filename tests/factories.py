"""A batch's life as the e2e tests and the benches tell it alike, through the OpenAI SDK: request lines, a JSONL
upload, a batch waited to its end, and every input line counted in its output and error files; and as the log
tells it (`batch_created`, `batch_life`), for the tests and benches of the services that fold it."""

import io
import json
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from openai import AuthenticationError, OpenAI
from openai.types import Batch

from contracts.api.batch import BatchUsage, Endpoint
from contracts.events.batch import (
    BatchAssigned,
    BatchCompleted,
    BatchCreated,
    BatchFinalizing,
    BatchProgressed,
    BatchStarted,
    BatchValidated,
)
from contracts.events.envelope import Event
from contracts.lifecycle import TERMINAL
from contracts.terms import BatchTerms

Line = dict[str, object]


def chat_line(custom_id: str, prompt: str, model: str = "smollm2", max_tokens: int = 12, **body: object) -> Line:
    """One `/v1/chat/completions` request line; `body` adds or overrides request fields (seed 7 by default)."""
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                     "seed": 7, **body}}


def long_lines(ids: Sequence[str]) -> list[bytes]:
    """Lines that each take a while to run (64 tokens of a story): a batch that is still running when poked."""
    return [json.dumps(chat_line(custom_id, "Write a long story about a dragon.", max_tokens=64)).encode()
            for custom_id in ids]


def jsonl(lines: Iterable[Line | bytes], name: str = "requests.jsonl") -> io.BytesIO:
    """An upload: each line as given (bytes, e.g. a broken one) or as JSON, one per line."""
    raw = b"".join((line if isinstance(line, bytes) else json.dumps(line).encode()) + b"\n" for line in lines)
    buffer = io.BytesIO(raw)
    buffer.name = name
    return buffer


def upload(client: OpenAI, lines: Iterable[Line | bytes], name: str = "input.jsonl") -> str:
    return client.files.create(file=jsonl(lines, name), purpose="batch").id


def upload_when_key_known(client: OpenAI, lines: Iterable[Line | bytes], name: str = "input.jsonl") -> str:
    """A fresh stack's gateway can answer before the ledger has folded the admin key: retry a 401 briefly."""
    buffer = jsonl(lines, name)
    for _ in range(100):
        try:
            return client.files.create(file=buffer, purpose="batch").id
        except AuthenticationError:
            time.sleep(0.1)
            buffer.seek(0)
    return client.files.create(file=buffer, purpose="batch").id


def wait_until_done(client: OpenAI, batch_id: str, timeout_s: float = 240, poll_s: float = 0.2,
                    ) -> tuple[Batch, list[str]]:
    """The batch once it has ended, and every status seen on the way there."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if not seen or seen[-1] != batch.status:
            seen.append(batch.status)
        if batch.status in TERMINAL:
            return batch, seen
        time.sleep(poll_s)
    raise TimeoutError(f"batch {batch_id} still {seen[-1]} after {timeout_s}s")


def wait_for_progress(client: OpenAI, batch_id: str, timeout_s: float = 90, poll_s: float = 0.1) -> None:
    """Until some lines are committed (so a kill or a change of credit lands mid-batch)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.request_counts and batch.request_counts.completed > 0:
            return
        time.sleep(poll_s)
    raise TimeoutError(f"batch {batch_id} made no progress")


def run_batch(client: OpenAI, file_id: str, timeout_s: float = 900, poll_s: float = 0.1) -> Batch:
    """A chat batch of the file, created and waited to its end."""
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    return wait_until_done(client, batch.id, timeout_s, poll_s)[0]


def custom_ids_seen(client: OpenAI, batch: Batch) -> Counter[str]:
    """How many times each custom_id appears across the batch's output and error files."""
    seen: Counter[str] = Counter()
    for file_id in (batch.output_file_id, batch.error_file_id):
        if file_id:
            seen.update(str(json.loads(line)["custom_id"]) for line in client.files.content(file_id).text.splitlines())
    return seen


def lost_and_duplicated(ids: Iterable[str], seen: Counter[str]) -> tuple[int, int]:
    """(input lines that appear in no file, extra copies of lines that appear more than once)."""
    return sum(1 for custom_id in ids if seen[custom_id] == 0), sum(n - 1 for n in seen.values() if n > 1)


# A batch's life as the log tells it (the ledger's tests and benches fold these facts, no stack around them).


T0 = 1_700_000_000
"""When the batches of these facts are created (seconds since the epoch)."""


def batch_terms(owner_key_id: str = "key_test", input_object_key: str = "files/file-in", created_at: int = T0,
                expires_at: int = T0 + 86_400, endpoint: Endpoint = "/v1/chat/completions",
                output_expires_after_s: int | None = None) -> BatchTerms:
    return BatchTerms(owner_key_id=owner_key_id, endpoint=endpoint, input_object_key=input_object_key,
                      created_at=created_at, expires_at=expires_at, output_expires_after_s=output_expires_after_s)


def batch_created(batch_id: str, owner_key_id: str = "key_test", input_object_key: str = "files/file-in", *,
                  created_at: int = T0, expires_at: int = T0 + 86_400, endpoint: Endpoint = "/v1/chat/completions",
                  output_expires_after_s: int | None = None, **fields: Any) -> BatchCreated:
    """`batch.created` of a 24 h batch on the input file at `input_object_key` (its id, unless `input_file_id`
    says); `fields`: any other of its fields."""
    fields.setdefault("input_file_id", input_object_key.removeprefix("files/"))
    return BatchCreated(aggregate_id=batch_id, completion_window="24h", terms=batch_terms(
        owner_key_id, input_object_key, created_at, expires_at, endpoint, output_expires_after_s), **fields)


def batch_life(batch_id: str, chunks: int, *, lines_per_chunk: int = 1, owner_key_id: str = "key_test",
               input_file_id: str = "file-in", output_file_id: str = "out", finalizing: bool = True,
               tokens_per_line: tuple[int, int] = (0, 0)) -> list[Event]:
    """One batch from creation to completion, as the services state it: created, validated, assigned to `exec-1`,
    started, `chunks` progress facts of `lines_per_chunk` lines each, finalizing (unless not), completed, with
    `tokens_per_line` (input, output) of usage."""
    total = chunks * lines_per_chunk
    input_tokens, output_tokens = tokens_per_line[0] * total, tokens_per_line[1] * total
    return [
        batch_created(batch_id, owner_key_id, f"files/{input_file_id}"),
        BatchValidated(aggregate_id=batch_id, total_lines=total, model="m"),
        BatchAssigned(aggregate_id=batch_id, executor_id="exec-1", attempt=1, lease_token="t"),
        BatchStarted(aggregate_id=batch_id, executor_id="exec-1", attempt=1, engine="llamacpp", engine_version="1"),
        *(BatchProgressed(aggregate_id=batch_id, attempt=1, chunk=c, chunk_key=f"c{c}",
                          completed=lines_per_chunk * (c + 1), failed=0) for c in range(chunks)),
        *([BatchFinalizing(aggregate_id=batch_id, attempt=1)] if finalizing else []),
        BatchCompleted(aggregate_id=batch_id, output_file_id=output_file_id, error_file_id=None, completed=total,
                       failed=0, usage=BatchUsage(input_tokens=input_tokens, output_tokens=output_tokens,
                                                  total_tokens=input_tokens + output_tokens)),
    ]
