"""The lines of an input file, read from the object store in the calling thread (blocking), a chunk's worth at a
time, as `ObjectStore.iter_lines` gives them: split at `\\n`, a trailing `\\r` removed, an unended last line kept."""

from collections.abc import Iterator

from services.runtime.storage.objectstore import READ_CHUNK, ObjectStore


def lines_by_chunk(store: ObjectStore, key: str, chunk_bytes: int = READ_CHUNK) -> Iterator[list[bytes]]:
    """The object's lines, in order, as the lists each chunk read completes. Raises `ObjectNotFound`."""
    response = store._open(key)
    try:
        pending = b""
        for chunk in response.stream(chunk_bytes):
            lines = chunk.split(b"\n")
            if pending:  # the line the last chunk began: only it is copied again, not the whole chunk
                lines[0] = pending + lines[0]
            pending = lines.pop()
            if lines:
                yield [line.removesuffix(b"\r") for line in lines]
        if pending:
            yield [pending.removesuffix(b"\r")]
    finally:
        response.close()
        response.release_conn()
