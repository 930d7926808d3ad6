"""The lines of an input file, read from the object store in the calling thread (blocking), a chunk's worth at a
time, as `ObjectStore.iter_lines` gives them: split at `\\n`, a trailing `\\r` removed, an unended last line kept;
a line longer than the limit only as a stand-in, so one long line costs neither quadratic copying nor its size."""

from collections.abc import Iterable, Iterator

from services.runtime.storage.lines import LineSplitter
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
    """The lines of `chunks`, as the lists each chunk completes; a line past `max_line_bytes` as a stand-in that
    validation refuses for its length alone (`LineSplitter`)."""
    splitter = LineSplitter(max_line_bytes)
    for chunk in chunks:
        if lines := splitter.feed(chunk):
            yield lines
    if last := splitter.finish():
        yield last
