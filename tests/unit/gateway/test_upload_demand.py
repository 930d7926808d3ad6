"""An upload's worst case is counted as its bytes stream by, however the stream is cut into chunks."""

import random

import orjson

from contracts.billing import FileDemand
from services.gateway.adapters.demand import DemandCounter


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
