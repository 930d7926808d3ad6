"""The committed lines of result chunks, for the results pages: a chunk is read within `MAX_CHUNK_BYTES` (an
executor's upload is not trusted to be small) and decoded off the event loop, `DECODES_AT_ONCE` at a time, one read
per chunk however many pages ask at once; the last decoded are kept (a chunk never changes once announced), so paging
through a chunk reads and decodes it once, not once a page."""

import asyncio
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from contracts.api.output_line import CommittedLine, decode_chunk
from contracts.objects import MAX_CHUNK_BYTES
from services.gateway.adapters.shared_reads import SharedReads
from services.runtime.storage.objectstore import ObjectNotFound, read_within

log = logging.getLogger(__name__)

Reader = Callable[[str], AsyncIterator[bytes]]

DECODES_AT_ONCE = 2
"""Chunks read and decoded at once (each decoded in a thread of its own): a results page never holds up the gateway's
loop, and no more than these are held whole in memory."""
KEPT_BYTES, KEPT_CHUNKS = 12 * 1024 * 1024, 1024
"""The decoded chunks kept, by the bytes they were read from (decoded, they take about 5.4 times as much: some
64 MiB) and by count; the most recently used stay."""


@dataclass
class ResultChunks:
    kept: OrderedDict[str, tuple[int, list[CommittedLine]]] = field(default_factory=OrderedDict)
    """Chunk key → (its bytes, its lines), the most recently used last."""
    kept_bytes: int = 0
    reads: SharedReads = field(default_factory=SharedReads)
    decoding: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(DECODES_AT_ONCE))

    async def lines(self, read: Reader, key: str) -> list[CommittedLine]:
        """The chunk's lines; none for a chunk removed with its batch, over `MAX_CHUNK_BYTES` or undecodable (the
        output file leaves those out too). `read`: the store's `iter_chunks`."""
        kept = self.kept.get(key)
        if kept is not None:
            self.kept.move_to_end(key)
            return kept[1]
        return await self.reads.read(key, lambda: self._read(read, key))

    async def _read(self, read: Reader, key: str) -> list[CommittedLine]:
        if key in self.kept:  # read by the request before, while this one waited
            return self.kept[key][1]
        lines: list[CommittedLine] = []
        async with self.decoding:  # read and decoded: at most `DECODES_AT_ONCE` chunks held whole at once
            try:
                data = await read_within(read(key), MAX_CHUNK_BYTES)
            except ObjectNotFound:  # announced, then removed with the batch's other objects: nothing to show of it
                return []
            if data is None:
                log.warning("result chunk %s is over %d bytes: its lines are not shown", key, MAX_CHUNK_BYTES)
            else:
                try:
                    lines = await asyncio.to_thread(decode_chunk, data)
                except ValueError as error:  # pydantic's ValidationError is one
                    log.warning("result chunk %s does not decode (%s): its lines are not shown", key, str(error)[:200])
        self._keep(key, MAX_CHUNK_BYTES if data is None else len(data), lines)
        return lines

    def _keep(self, key: str, size: int, lines: list[CommittedLine]) -> None:
        self.kept[key] = (size, lines)
        self.kept_bytes += size
        while (self.kept_bytes > KEPT_BYTES or len(self.kept) > KEPT_CHUNKS) and len(self.kept) > 1:
            _, (dropped, _) = self.kept.popitem(last=False)
            self.kept_bytes -= dropped
