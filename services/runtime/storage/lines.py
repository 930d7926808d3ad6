"""The lines of a stream of chunks (`LineSplitter`), as every reader of an input file splits them: at `\\n`, a
trailing `\\r` removed, an unended last line kept, a UTF-8 byte-order mark before the first line dropped (editors on
Windows write one; it is no part of the JSON). A line spanning chunks is gathered in pieces and joined once, so a
long line costs its length, never a copy per chunk; given a limit, only the beginning of a line past it is kept, as a
stand-in still over the limit (blank only if the line is), the rest skipped up to its newline."""

import sys

BYTE_ORDER_MARK = b"\xef\xbb\xbf"


class LineSplitter:
    def __init__(self, max_line_bytes: int | None = None) -> None:
        self._cap = max_line_bytes + 2 if max_line_bytes is not None else sys.maxsize
        """Bytes kept of a line: a stand-in is still over the limit once a trailing `\\r` is taken off."""
        self._pieces: list[bytes] = []
        self._held = 0
        self._dropped_content = False
        """Bytes past the cap held more than whitespace."""
        self._first = True
        """No line was given yet: the next may begin with a byte-order mark."""

    def feed(self, chunk: bytes) -> list[bytes]:
        """The lines `chunk` completes (the line an earlier chunk began first)."""
        lines = chunk.split(b"\n")
        rest = lines.pop()
        if not lines:
            self._add(rest)
            return []
        if self._held:
            lines[0] = self._end(lines[0])
        self._begin(rest)
        if self._first:
            lines[0], self._first = lines[0].removeprefix(BYTE_ORDER_MARK), False
        return [line.removesuffix(b"\r") for line in lines]

    def finish(self) -> list[bytes]:
        """The unended last line, if there is one."""
        if not self._held:
            return []
        last = self._end(b"").removesuffix(b"\r")
        if self._first:
            last, self._first = last.removeprefix(BYTE_ORDER_MARK), False
        return [last]

    def _begin(self, piece: bytes) -> None:
        self._pieces, self._held, self._dropped_content = [], 0, False
        self._add(piece)

    def _add(self, piece: bytes) -> None:
        if self._held < self._cap:
            kept = piece[:self._cap - self._held]  # the piece itself (no copy) while the line is within the cap
            self._pieces.append(kept)
            self._held += len(kept)
            piece = piece[len(kept):]
        if piece and not self._dropped_content and not piece.isspace():
            self._dropped_content = True

    def _end(self, last: bytes) -> bytes:
        """The whole line (or its stand-in), `last` its final piece; nothing is kept after."""
        self._add(last)
        line = b"".join(self._pieces)
        if self._dropped_content and line.isspace():
            line = line[:-1] + b"?"  # the line is not blank: neither is its stand-in
        self._begin(b"")
        return line
