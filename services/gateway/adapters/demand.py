"""An upload's worst case (what a billed batch on it can cost at most), counted as its bytes stream by: each line parsed
once, a line that is not a JSON object left to the validator; only the running sums and one partial line are kept."""

from typing import Any

import orjson

from contracts.api.request_line import MAX_SAMPLES, completion_prompts
from contracts.billing import FileDemand

OUTPUT_LIMITS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
"""The request fields that bound a line's output, in the order a line's own is read."""


class DemandCounter:
    def __init__(self) -> None:
        self._partial: list[bytes] = []
        """The unfinished line's pieces, joined once its newline comes (never copied nor searched again per chunk)."""
        self._lines = self._bytes = self._samples = self._output = self._open = 0
        self._model: str | None = None

    def feed(self, chunk: bytes) -> None:
        start = 0
        while (end := chunk.find(b"\n", start)) != -1:
            self._line(self._joined(chunk[start:end]))
            start = end + 1
        if start < len(chunk):
            self._partial.append(chunk[start:])

    def finish(self) -> FileDemand:
        if self._partial:
            self._line(self._joined(b""))
        return FileDemand(lines=self._lines, prompt_bytes=self._bytes, samples=self._samples,
                          output_tokens=self._output, open_samples=self._open, model=self._model)

    def _joined(self, end: bytes) -> bytes:
        if not self._partial:
            return end
        line, self._partial = b"".join((*self._partial, end)), []
        return line

    def _line(self, raw: bytes) -> None:
        if not raw.strip():
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
        if self._model is None and isinstance(body.get("model"), str):
            self._model = body["model"]


def _samples(n: Any) -> int:
    return n if _is_count(n) and 1 <= n <= MAX_SAMPLES else 1


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
