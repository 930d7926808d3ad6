"""An upload's worst case (what a billed batch on it can cost at most), counted as its bytes stream by: each line parsed
once, a line that is not a JSON object left to the validator, a line longer than any that runs never parsed (nor kept
past its first `MAX_LINE_BYTES`); only the running sums and one partial line are kept."""

from typing import Any

import orjson

from contracts.api.model import MAX_MODEL_NAME
from contracts.api.request_line import MAX_LINE_BYTES, MAX_SAMPLES, completion_prompts
from contracts.billing import FileDemand
from services.runtime.storage.lines import LineSplitter

OUTPUT_LIMITS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
"""The request fields that bound a line's output, in the order a line's own is read."""


class DemandCounter:
    def __init__(self) -> None:
        self._lines_of = LineSplitter(MAX_LINE_BYTES)
        """A line past `MAX_LINE_BYTES` comes as a stand-in still past it: validation refuses it, so it never runs and
        costs nothing."""
        self._lines = self._bytes = self._samples = self._output = self._open = 0
        self._model: str | None = None
        self._named = False
        """A line named a model (kept in `_model` only if it could be a model's id)."""

    def feed(self, chunk: bytes) -> None:
        for line in self._lines_of.feed(chunk):
            self._line(line)

    def finish(self) -> FileDemand:
        for line in self._lines_of.finish():
            self._line(line)
        return FileDemand(lines=self._lines, prompt_bytes=self._bytes, samples=self._samples,
                          output_tokens=self._output, open_samples=self._open, model=self._model)

    def _line(self, raw: bytes) -> None:
        if len(raw) > MAX_LINE_BYTES or not raw.strip():
            return
        try:
            line = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return
        body = line.get("body") if isinstance(line, dict) else None
        if not isinstance(body, dict):
            return
        samples = _samples(body.get("n")) * completion_prompts(body.get("prompt"))  # each prompt answers apart
        self._lines += 1
        self._bytes += len(raw)
        self._samples += samples
        limit = next((body[field] for field in OUTPUT_LIMITS if field in body), None)
        if isinstance(limit, int) and _is_count(limit):
            self._output += limit * samples
        else:
            self._open += samples
        if not self._named and isinstance(model := body.get("model"), str):
            self._named = True
            self._model = model if len(model) <= MAX_MODEL_NAME else None  # names no model; never put in a fact


def _samples(n: Any) -> int:
    return n if _is_count(n) and 1 <= n <= MAX_SAMPLES else 1


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
