"""An upload's worst case is counted as its bytes stream by, however the stream is cut into chunks."""

import random
import tracemalloc

import orjson

from contracts.api.model import MAX_MODEL_NAME
from contracts.api.request_line import MAX_LINE_BYTES
from contracts.billing import FileDemand
from services.gateway.adapters.demand import DemandCounter
from services.gateway.adapters.upload import CHUNK


def demand_of(chunks: list[bytes]) -> FileDemand:
    counter = DemandCounter()
    for chunk in chunks:
        counter.feed(chunk)
    return counter.finish()


def test_any_cut_of_the_stream_counts_the_same_lines_samples_and_tokens() -> None:
    lines = [orjson.dumps({"custom_id": str(i), "body": {"model": "m", "max_tokens": i % 7 + 1, "n": 1 + i % 3}})
             for i in range(50)]
    data = b"\n".join(lines) + b"\n\nnot json\n" + b'{"body": {"model": "x"}}'  # the last line has no newline
    whole = demand_of([data])
    assert (whole.lines, whole.samples, whole.output_tokens, whole.open_samples, whole.model) == (
        51, sum(1 + i % 3 for i in range(50)) + 1, sum((i % 7 + 1) * (1 + i % 3) for i in range(50)), 1, "m")
    rng = random.Random(7)
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(data)), 40))
        assert demand_of([data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]) == whole


def test_a_line_spread_over_many_chunks_is_counted_once_when_it_ends() -> None:
    line = b'{"body": {"model": "m", "max_tokens": 5, "messages": [{"content": "' + b"a" * 100_000 + b'"}]}}'
    demand = demand_of([line[i:i + 1000] for i in range(0, len(line), 1000)] + [b"\n"])
    assert (demand.lines, demand.prompt_bytes, demand.output_tokens) == (1, len(line), 5)


def test_each_prompt_of_a_completions_line_is_a_sample_of_its_own() -> None:
    line = orjson.dumps({"custom_id": "p", "body": {"model": "m", "prompt": ["a", "b", "c"], "max_tokens": 5, "n": 2}})
    demand = demand_of([line + b"\n"])
    assert (demand.samples, demand.output_tokens) == (6, 30)
    ids = demand_of([orjson.dumps({"body": {"model": "m", "prompt": [1, 2, 3], "max_tokens": 5}}) + b"\n"])
    assert (ids.samples, ids.output_tokens) == (1, 5)  # one prompt given as token ids


def test_a_line_too_long_to_run_is_not_counted_and_the_lines_after_it_are() -> None:
    good = orjson.dumps({"custom_id": "g", "body": {"model": "m", "max_tokens": 5}})
    too_long = orjson.dumps({"custom_id": "t", "body": {"model": "m", "max_tokens": 7, "messages": [
        {"content": "a" * MAX_LINE_BYTES}]}})
    for cut in (CHUNK, len(too_long) + 10):
        data = too_long + b"\n" + good + b"\n" + too_long  # the last one unended
        demand = demand_of([data[i:i + cut] for i in range(0, len(data), cut)])
        assert (demand.lines, demand.prompt_bytes, demand.output_tokens) == (1, len(good), 5)
    at_the_limit = good[:-2] + b',"pad":"' + b"p" * (MAX_LINE_BYTES - len(good) - 9) + b'"}}'
    assert len(at_the_limit) == MAX_LINE_BYTES and demand_of([at_the_limit]).lines == 1
    ended = at_the_limit + b"\r\n"
    assert demand_of([ended[i:i + CHUNK] for i in range(0, len(ended), CHUNK)]).lines == 1, "its \\r is not its own"


def test_an_unended_line_of_many_megabytes_holds_at_most_the_longest_line_in_memory() -> None:
    chunk = b"[" * CHUNK
    counter = DemandCounter()
    tracemalloc.start()
    try:
        for _ in range(40):  # 10 MiB of one line, never parsed nor joined
            counter.feed(chunk)
        demand = counter.finish()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert demand.lines == 0
    assert peak < 2 * MAX_LINE_BYTES


def test_a_model_name_longer_than_any_models_id_is_not_kept() -> None:
    named = orjson.dumps({"custom_id": "a", "body": {"model": "m" * (MAX_MODEL_NAME + 1), "max_tokens": 1}})
    after = orjson.dumps({"custom_id": "b", "body": {"model": "smollm2", "max_tokens": 1}})
    demand = demand_of([named + b"\n" + after + b"\n"])
    assert (demand.lines, demand.model) == (2, None), "the first model a line names, which is no model"
    assert demand_of([after + b"\n" + named]).model == "smollm2"
