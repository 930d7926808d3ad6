"""The lines of a stream of chunks (`LineSplitter`), as every reader of an input file splits them: at `\\n`, a
trailing `\\r` removed, an unended last line kept, a UTF-8 byte-order mark before the first line dropped (editors on
Windows write one; it is no part of the JSON). A line spanning chunks is gathered in pieces and joined once, so a
long line costs its length, never a copy per chunk; given a limit, only the beginning of a line past it is kept, as a
stand-in still over the limit (blank only if the line is), the rest skipped up to its newline."""

import sys

BYTE_ORDER_MARK = b"\xef\xbb\xbf"



def without_mark(number: int, line: bytes) -> bytes:
    """Line `number` of a file as `LineSplitter` gives it, for a reader that splits a file itself (by offsets)."""
    return line.removeprefix(BYTE_ORDER_MARK) if number == 1 else line


class LineSplitter:
    def __init__(self, max_line_bytes: int | None = None) -> None:
        self._cap = max_line_bytes + 2 if max_line_bytes is not None else sys.maxsize
        """Bytes kept of a line: a stand-in is still over the limit once a trailing `\\r` is taken off."""
        self._pieces: list[bytes] = []
        self._held = 0
        self._dropped_content = False
        """Bytes past the cap held more than whitespace."""
        self._head: bytes | None = b""
        """The stream's first bytes while they may still be a byte-order mark; None once past it."""

    def feed(self, chunk: bytes) -> list[bytes]:
        """The lines `chunk` completes (the line an earlier chunk began first)."""
        if self._head is not None:  # before anything counts towards the first line's length
            chunk = self._past_mark(chunk)
            if not chunk:
                return []
        lines = chunk.split(b"\n")
        rest = lines.pop()
        if not lines:
            self._add(rest)
            return []
        if self._held:
            lines[0] = self._end(lines[0])
        self._begin(rest)
        return [line.removesuffix(b"\r") for line in lines]

    def finish(self) -> list[bytes]:
        """The unended last line, if there is one."""
        if self._head:  # a stream of one or two bytes that began like a mark: they were the line
            self._add(self._head)
        self._head = None
        return [self._end(b"").removesuffix(b"\r")] if self._held else []

    def _past_mark(self, chunk: bytes) -> bytes:
        """`chunk` without the byte-order mark the stream began with (held back while it may still be one)."""
        assert self._head is not None
        head = self._head + chunk
        if len(head) < len(BYTE_ORDER_MARK) and BYTE_ORDER_MARK.startswith(head):
            self._head = head
            return b""
        self._head = None
        return head.removeprefix(BYTE_ORDER_MARK)

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
