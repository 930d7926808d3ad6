"""The lines of an input file, read from the object store in the calling thread (blocking), a chunk's worth at a
time, as `ObjectStore.iter_lines` gives them: split at `\\n`, a trailing `\\r` removed, an unended last line kept;
a line longer than the limit only as a stand-in, so one long line costs neither quadratic copying nor its size."""

from collections.abc import Iterable, Iterator

from services.runtime.storage.objectstore import READ_CHUNK, ObjectStore


def lines_by_chunk(store: ObjectStore, key: str, max_line_bytes: int,
                   chunk_bytes: int = READ_CHUNK) -> Iterator[list[bytes]]:
    """The object's lines, in order, as the lists each chunk read completes (see `chunk_lines`). Raises
    `ObjectNotFound`."""
    response = store._open(key)
    try:
        yield from chunk_lines(response.stream(chunk_bytes), max_line_bytes)
    finally:
        response.close()
        response.release_conn()


def chunk_lines(chunks: Iterable[bytes], max_line_bytes: int) -> Iterator[list[bytes]]:
    """The lines of `chunks`, as the lists each chunk completes. A line that spans chunks and passes
    `max_line_bytes` comes as a stand-in: its first bytes, still over the limit (validation refuses it for its length
    alone), blank only if the line is; the rest of it is skipped up to its newline."""
    unended = Unended(max_line_bytes)
    for chunk in chunks:
        lines = chunk.split(b"\n")
        rest = lines.pop()
        if lines and unended:  # the line an earlier chunk began ends here
            lines[0] = unended.end(lines[0])
        if lines:
            yield [line.removesuffix(b"\r") for line in lines]
            unended.begin(rest)
        else:
            unended.add(rest)
    if unended:
        yield [unended.end(b"").removesuffix(b"\r")]


class Unended:
    """The line the chunks read so far leave unended: its pieces, joined once when it ends (only they are copied
    again, never a chunk, and each once); of a line past the limit, only its beginning."""

    def __init__(self, max_line_bytes: int) -> None:
        self.cap = max_line_bytes + 2
        """Bytes kept of a line: a stand-in is still over the limit once a trailing `\\r` is taken off."""
        self.pieces: list[bytes] = []
        self.held = 0
        self.dropped_content = False
        """Bytes past `cap` held more than whitespace."""

    def __bool__(self) -> bool:
        return self.held > 0

    def begin(self, piece: bytes) -> None:
        self.pieces, self.held, self.dropped_content = [], 0, False
        self.add(piece)

    def add(self, piece: bytes) -> None:
        if self.held < self.cap:
            kept = piece[:self.cap - self.held]  # the piece itself (no copy) while the line is within the cap
            self.pieces.append(kept)
            self.held += len(kept)
            piece = piece[len(kept):]
        if piece and not self.dropped_content and not piece.isspace():
            self.dropped_content = True

    def end(self, last: bytes) -> bytes:
        """The whole line (or its stand-in), `last` its final piece; nothing is kept after."""
        self.add(last)
        line = b"".join(self.pieces)
        if self.dropped_content and line.isspace():
            line = line[:-1] + b"?"  # the line is not blank: neither is its stand-in
        self.begin(b"")
        return line
