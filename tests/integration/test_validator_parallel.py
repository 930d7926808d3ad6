"""A file of many windows is checked in the validator and in a worker process at once, and its verdict is exactly
the one checking every line in order gives: each refused line with its code at its line, duplicates across windows,
one model for the file, and a model inherited from an earlier window (Reliquary's files)."""

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import psutil
import pytest

from contracts.events.batch import BatchValidated, BatchValidationFailed, LineRejected
from contracts.ids import new_batch_id, new_file_id
from contracts.subjects import input_object_key
from services.runtime.nats.bus import EventBus
from services.runtime.storage.catalogue import load_catalogue
from services.runtime.storage.objectstore import ObjectStore
from services.validator.adapters.check_pool import CheckPool
from services.validator.adapters.tokenizer import TokenizerCache
from services.validator.domain import FileValidation, Limits
from services.validator.file_check import WINDOW_LINES
from services.validator.handlers import Validator
from tests.factories import batch_created
from tests.support import batch_facts

CHAT = "/v1/chat/completions"
LINES = 5 * WINDOW_LINES + 17


def line(custom_id: str, model: str | None = "smollm2", content: str = "hi") -> bytes:
    body: dict[str, object] = {"messages": [{"role": "user", "content": content}]}
    if model is not None:
        body["model"] = model
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body})


def many_windows(first_model: int | None = None) -> list[bytes]:
    """Bad lines in every window; with `first_model`, lines before it name no model and the ones after some don't."""
    lines = []
    for n in range(1, LINES + 1):
        model: str | None = "smollm2"
        if first_model is not None:
            model = None if n < first_model or n % 3 == 0 else "smollm2"
        if n % 97 == 0:
            lines.append(b'{"custom_id": "broken"')
        elif n % 211 == 0:
            lines.append(line("c5", model))  # the custom_id of line 5: a duplicate, windows later
        elif n == 4 * WINDOW_LINES + 3:
            lines.append(line(f"c{n}", "smollm2-135m-embed"))  # a model that does not serve the endpoint
        elif n % 157 == 0:
            lines.append(line(f"c{n}", model, "word " * 2100))  # over the context
        else:
            lines.append(line(f"c{n}", model))
    return lines


@pytest.fixture(scope="module")
async def pool() -> AsyncIterator[CheckPool]:
    checking = CheckPool(load_catalogue(None), processes=1)
    await asyncio.to_thread(checking.warm_up)
    yield checking
    checking.close()


def checked_in_order(lines: list[bytes], inherit: bool) -> list[tuple[int, str]]:
    validation = FileValidation(CHAT, load_catalogue(None), Limits(inherit_line_model=inherit), TokenizerCache())
    return [(result.line, issue.code) for n, raw in enumerate(lines, 1)
            for result in [validation.check(n, raw)] for issue in result.issues]


async def verdict_of(bus: EventBus, store: ObjectStore, pool: CheckPool, lines: list[bytes],
                     inherit: bool) -> list[Any]:
    """The facts of validating `lines` with the validator's own handler, a worker process beside it."""
    file_id, batch_id = new_file_id(), new_batch_id()
    await store.put_bytes(input_object_key(file_id), b"\n".join(lines) + b"\n")
    validator = Validator(bus, store, load_catalogue(None), Limits(inherit_line_model=inherit),
                          max_published_per_code=100, tokenizers=TokenizerCache(), pool=pool)
    await validator.validate(batch_created(batch_id, "key_test", input_object_key(file_id), created_at=0,
                                           expires_at=86400))
    return await batch_facts(bus, batch_id, lambda e: isinstance(e, BatchValidated | BatchValidationFailed))


def first_of_each_code(found: list[tuple[int, str]], kept: int) -> list[tuple[int, str]]:
    """What the validator publishes: the first `kept` errors of each code, in line order."""
    seen: dict[str, int] = {}
    published = []
    for n, code in found:
        seen[code] = seen.get(code, 0) + 1
        if seen[code] <= kept:
            published.append((n, code))
    return published


def counted(found: list[tuple[int, str]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for _, code in found:
        counts[code] = counts.get(code, 0) + 1
    return counts


@pytest.mark.parametrize("first_model", [None, 2 * WINDOW_LINES + 5], ids=["every-line-names-it", "inherited"])
async def test_a_file_checked_in_two_processes_is_refused_line_for_line_as_in_order(
        bus: EventBus, object_store: ObjectStore, pool: CheckPool, first_model: int | None) -> None:
    inherit = first_model is not None
    lines = many_windows(first_model)
    expected = checked_in_order(lines, inherit)
    codes = {"invalid_json", "duplicate_custom_id", "unsupported_endpoint", "context_too_long"}
    assert {code for _, code in expected} == (codes | {"missing_model"} if inherit else codes)
    if inherit:  # lines before the first model named have none; the ones after it inherit it
        assert all(n < first_model for n, code in expected if code == "missing_model")  # type: ignore[operator]
    facts = await verdict_of(bus, object_store, pool, lines, inherit)
    verdict = facts[-1]
    assert isinstance(verdict, BatchValidationFailed)
    assert (verdict.total_lines, verdict.error_count) == (LINES, len(expected))
    assert verdict.counts_by_code == counted(expected)
    published = [(f.line, f.code) for f in facts if isinstance(f, LineRejected)]
    assert published == first_of_each_code(expected, 100)


HOLDER = """
import sys, time
from services.runtime.storage.catalogue import load_catalogue
from services.validator.adapters.check_pool import CheckPool
if __name__ == "__main__":
    pool = CheckPool(load_catalogue(None), 1)
    pool.warm_up()
    print("ready", flush=True)
    time.sleep(600)
"""


def test_a_worker_ends_when_the_validator_that_started_it_is_killed(tmp_path: Path) -> None:
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    holder = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).parents[2])
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        workers = psutil.Process(holder.pid).children(recursive=True)
        assert workers, "the pool started its worker"
    finally:
        holder.kill()
        holder.wait()
    _, alive = psutil.wait_procs(workers, timeout=20)
    assert not alive, f"workers outlived their validator: {[p.pid for p in alive]}"
