"""Each batch's input, downloaded once per executor into an unnamed temporary file with every line's end offset, so a
unit reads its own lines by offset while the copy fills. Copies go when idle, forgotten or over the disk budget (past
it a unit streams the rest from the store); file IO runs in the cache's own threads."""

import asyncio
import bisect
import contextlib
import logging
import os
import re
import tempfile
from array import array
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import IO, TypeVar

from services.executor.adapters.objects import ObjectAccess
from services.runtime.storage.lines import without_mark
from services.runtime.storage.objectstore import close_stream

log = logging.getLogger(__name__)

BUDGET_BYTES = 2 * 1024**3
"""Disk the copies may take together (the gateway takes files of up to 100 MiB)."""
IDLE_S = 60.0
"""How long a copy is kept once no unit of its batch holds it."""
IO_THREADS = 2
BLOCK_LINES = 256
BLOCK_BYTES = 1024 * 1024
"""Lines read from the copy at once, at most (a unit of 64 lines is one read)."""
NEWLINE = re.compile(b"\n")
Result = TypeVar("Result")


class InputCopy:
    """One batch's input object as far as it has arrived."""

    def __init__(self, cache: "InputCache", batch_id: str, key: str, file: IO[bytes]) -> None:
        self.cache = cache
        self.batch_id = batch_id
        self.key = key
        self.file = file
        self.ends = array("q")
        """End offset (after its newline) of each line that has fully arrived: line n ends at `ends[n - 1]`."""
        self.size = 0
        self.reserved = 0
        """Bytes of the disk budget this copy holds."""
        self.complete = False
        self.spilled = False
        """The disk budget ran out: lines past those in `ends` are streamed from the store."""
        self.error: BaseException | None = None
        self.grown = asyncio.Event()
        """Set (and replaced) whenever more lines arrived or the download ended."""
        self.holders = 0
        self.in_flight = 0
        """File reads and writes running in a thread: the file is closed only once none runs."""
        self.retired = False
        self.idle: asyncio.TimerHandle | None = None
        self.download: asyncio.Task[None] | None = None

    async def lines(self, first: int, last: int | None, stop: asyncio.Event) -> AsyncGenerator[tuple[int, bytes], None]:
        """Lines `first` to `last` (None: the end), numbered (blanks count), unterminated, as they come, till `stop`."""
        number = first
        while last is None or number <= last:
            while len(self.ends) < number and not self.complete:
                if self.error is not None:
                    raise self.error
                if self.spilled:
                    async for numbered in self._streamed(number, last):
                        yield numbered
                    return
                if stop.is_set():
                    return
                await _first_of(self.grown, stop)
            if len(self.ends) < number:
                return  # the object has fewer lines
            upto = len(self.ends) if last is None else min(last, len(self.ends))
            start = self.ends[number - 2] if number > 1 else 0
            within = bisect.bisect_right(self.ends, start + BLOCK_BYTES, lo=number - 1, hi=upto)
            upto = min(upto, number + BLOCK_LINES - 1, max(within, number))
            data = await self.cache.io(self, self._read, start, self.ends[upto - 1] - start)
            for piece in data.split(b"\n")[:upto - number + 1]:
                yield number, without_mark(number, piece.removesuffix(b"\r"))
                number += 1

    def _read(self, start: int, length: int) -> bytes:
        return os.pread(self.file.fileno(), length, start)

    def _write(self, offset: int, chunk: bytes) -> list[int]:
        """Write `chunk` at `offset`; the end offsets of the lines it completes."""
        os.pwrite(self.file.fileno(), chunk, offset)
        return [offset + newline.end() for newline in NEWLINE.finditer(chunk)]

    async def _streamed(self, number: int, last: int | None) -> AsyncIterator[tuple[int, bytes]]:
        """The lines from `number` on, from the store (the copy holds fewer)."""
        raw_lines = self.cache.store.iter_lines(self.key)
        try:
            line = 0
            async for raw in raw_lines:
                line += 1
                if line < number:
                    continue
                if last is not None and line > last:
                    break
                yield line, raw
        finally:
            await close_stream(raw_lines)

    def grew(self) -> None:
        self.grown.set()
        self.grown = asyncio.Event()


class InputCache:
    """The input copies of the batches with units on this executor, by batch."""

    def __init__(self, store: ObjectAccess, budget_bytes: int = BUDGET_BYTES, idle_s: float = IDLE_S) -> None:
        self.store = store
        self.budget_bytes = budget_bytes
        self.idle_s = idle_s
        self.copies: dict[str, InputCopy] = {}
        self.used_bytes = 0
        self.pool = ThreadPoolExecutor(max_workers=IO_THREADS, thread_name_prefix="input-copy")
        self.downloads = 0
        """Downloads started (a measure: one per batch while its copy lives)."""

    @contextlib.asynccontextmanager
    async def hold(self, batch_id: str, key: str) -> AsyncIterator[InputCopy]:
        """The batch's copy of object `key`, downloading (once) if no unit holds or recently held one."""
        copy = self.copies.get(batch_id)
        if copy is None or copy.key != key or copy.error is not None:
            if copy is not None:
                self._retire(copy)
            copy = await self._start(batch_id, key)
        copy.holders += 1
        if copy.idle is not None:
            copy.idle.cancel()
            copy.idle = None
        try:
            yield copy
        finally:
            copy.holders -= 1
            if not copy.holders:
                if copy.error is not None:
                    self._retire(copy)  # the next unit downloads again
                elif not copy.retired:
                    copy.idle = asyncio.get_running_loop().call_later(self.idle_s, self._retire, copy)
                self._close_if_unused(copy)

    def forget(self, batch_id: str) -> None:
        """Drop the batch's copy (its batch ended); a unit still reading it finishes first."""
        copy = self.copies.get(batch_id)
        if copy is not None:
            self._retire(copy)

    def close(self) -> None:
        for copy in list(self.copies.values()):
            self._retire(copy)
        self.pool.shutdown(wait=False, cancel_futures=True)

    async def io(self, copy: InputCopy, call: Callable[..., Result], *args: object) -> Result:
        """`call` in the cache's threads, counted until done even if cancelled: the file is never closed under it."""
        loop = asyncio.get_running_loop()
        copy.in_flight += 1
        future: Future[Result] = self.pool.submit(call, *args)
        future.add_done_callback(lambda _: loop.call_soon_threadsafe(self._io_done, copy))
        return await asyncio.wrap_future(future)

    def _io_done(self, copy: InputCopy) -> None:
        copy.in_flight -= 1
        self._close_if_unused(copy)

    async def _start(self, batch_id: str, key: str) -> InputCopy:
        file = await asyncio.get_running_loop().run_in_executor(self.pool, tempfile.TemporaryFile)
        raced = self.copies.get(batch_id)
        if raced is not None and raced.key == key and raced.error is None:
            file.close()  # another unit of the batch started the download while the file was made
            return raced
        copy = self.copies[batch_id] = InputCopy(self, batch_id, key, file)
        copy.download = asyncio.create_task(self._download(copy))
        self.downloads += 1
        return copy

    async def _download(self, copy: InputCopy) -> None:
        chunks = self.store.iter_chunks(copy.key)
        try:
            async for chunk in chunks:
                if not self._reserve(copy, len(chunk)):
                    log.warning("batch %s: its input %s does not fit the %d-byte disk budget; its lines past line %d "
                                "are streamed from the store", copy.batch_id, copy.key, self.budget_bytes,
                                len(copy.ends))
                    copy.spilled = True
                    return
                copy.ends.extend(await self.io(copy, copy._write, copy.size, chunk))
                copy.size += len(chunk)
                copy.grew()
            if copy.size > (copy.ends[-1] if copy.ends else 0):
                copy.ends.append(copy.size)  # a last line without a newline
            copy.complete = True
        except Exception as error:
            log.warning("batch %s: downloading its input %s failed: %r", copy.batch_id, copy.key, error)
            copy.error = error
        finally:
            await close_stream(chunks)
            copy.grew()

    def _reserve(self, copy: InputCopy, size: int) -> bool:
        while self.used_bytes + size > self.budget_bytes:
            idle = [other for other in self.copies.values() if not other.holders and other is not copy]
            if not idle:
                return False
            self._retire(min(idle, key=lambda other: other.size))
        self.used_bytes += size
        copy.reserved += size
        return True

    def _retire(self, copy: InputCopy) -> None:
        if copy.retired:
            return
        copy.retired = True
        if self.copies.get(copy.batch_id) is copy:
            del self.copies[copy.batch_id]
        if copy.idle is not None:
            copy.idle.cancel()
            copy.idle = None
        if copy.download is not None and not copy.download.done():
            copy.download.cancel()
        self._close_if_unused(copy)

    def _close_if_unused(self, copy: InputCopy) -> None:
        if copy.retired and not copy.holders and not copy.in_flight and not copy.file.closed:
            copy.file.close()
            self.used_bytes -= copy.reserved
            copy.reserved = 0


async def _first_of(*events: asyncio.Event) -> None:
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
