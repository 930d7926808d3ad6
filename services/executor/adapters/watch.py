"""Following a batch's event log live: one feed per batch with attempts here, read once and shared (a read per unit
would cost every unit the batch's size), open `linger_s` after its last attempt left; each attempt's watch over it."""

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable

import nats.errors

from services.executor.adapters.desk import Sequenced
from services.executor.adapters.log_reader import pages_of, pages_to_end
from services.executor.attempts import BatchLog, StopReason
from services.runtime.nats.bus import EventBus

log = logging.getLogger(__name__)

LINGER_S = 10.0
"""How long a feed stays open after the last attempt of its batch here ended."""
POLL_S = 0.5
"""How often a followed batch's log is read again while nothing new came."""


class BatchFeed:
    """One batch's log as read so far; every attempt of the batch here folds nothing itself, it reads this."""

    def __init__(self, batch_id: str, bus: EventBus) -> None:
        self.batch_id = batch_id
        self.bus = bus
        self.pages = pages_of(bus)
        self.after = 0
        """The last stream sequence read: the next page starts after it."""
        self.at_end = False
        """The last page said no more follow: the follower asks for the next only after `POLL_S`."""
        self.reading = asyncio.Lock()
        """One page at a time: a page is folded before the next is asked for, so the log is folded in order."""
        self.log = BatchLog()
        self.seen_sequence = 0
        self.moved = asyncio.Event()
        """Set (and replaced) whenever new facts were folded."""
        self.watches: set[BatchWatch] = set()
        self.broken = False
        """It could not be brought up to date: a fresh one serves the attempts that come next."""
        self.ended_here = False
        """An attempt here published the batch's terminal fact: the feed closes at once (it may not have read it)."""
        self._closed = False
        # The hub's hold on the feed: the task that keeps it followed, and when it may close.
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.done = asyncio.Event()
        """Set to close the feed."""
        self.task: asyncio.Task[None] | None = None
        self.linger: asyncio.TimerHandle | None = None

    def fold(self, events: list[Sequenced]) -> None:
        for sequence, event in events:
            self.log.fold(event, sequence)
            self.seen_sequence = max(self.seen_sequence, sequence)
        for watch in list(self.watches):
            watch.update()
        self.moved.set()
        self.moved = asyncio.Event()

    async def caught_up_to(self, sequence: int, within_s: float = 10.0) -> bool:
        """Wait until the log is folded up to `sequence`; False if it was not within `within_s`."""
        return await self.folded(lambda _: self.seen_sequence >= sequence, within_s)

    async def folded(self, holds: Callable[[BatchLog], bool], within_s: float = 10.0) -> bool:
        """Wait until the log folded so far `holds`; False if it did not within `within_s`."""
        deadline = time.monotonic() + within_s
        while not holds(self.log):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.moved.wait(), remaining)
        return True

    async def read_until(self, holds: Callable[[BatchLog], bool], within_s: float = 10.0) -> bool:
        """`folded`, after reading to the log's end at once (a fact just published is seen without the follower)."""
        if not holds(self.log):
            with contextlib.suppress(nats.errors.Error, OSError, TimeoutError):
                await asyncio.wait_for(self.catch_up(), within_s)
        return await self.folded(holds, within_s)

    async def catch_up(self) -> None:
        async with self.reading:
            async for facts, after, more in pages_to_end(self.pages, self.batch_id, self.after):
                self.after, self.at_end = after, not more
                self.fold(facts)

    @contextlib.asynccontextmanager
    async def followed(self, expires_at: int | None) -> AsyncIterator["BatchFeed"]:
        """Read the log to its end, then follow it until the block ends."""
        self.log.expires_at = expires_at
        await self.catch_up()
        following = asyncio.create_task(self._follow())
        try:
            yield self
        finally:
            self._closed = True
            following.cancel()
            # A fetch may swallow the cancellation (asyncio.wait_for in 3.11); the flag ends the loop.
            await asyncio.wait({following}, timeout=2.0)

    async def _follow(self) -> None:
        """The next page, again and again, after a pause of `POLL_S` while the log was read to its end."""
        while not self._closed:
            try:
                if self.at_end:
                    await asyncio.sleep(POLL_S)
                async with self.reading:
                    facts, self.after, more = await self.pages(self.batch_id, self.after)
                    self.at_end = not more
                    self.fold(facts)
            except (nats.errors.Error, OSError) as error:
                if self.bus.nc.is_closed:
                    return  # the executor is stopping: nothing more comes
                # The broker may be reconnecting; the next page resumes where this one stopped.
                log.warning("batch %s: following its log was interrupted: %r", self.batch_id, error)
                await asyncio.sleep(0.5)


class BatchWatch:
    """An attempt's view of its feed: `stopping` is set on cancel, expiry, its lost lease or the batch's end."""

    def __init__(self, attempt: int, feed: BatchFeed) -> None:
        self.attempt = attempt
        self.feed = feed
        self.stopping = asyncio.Event()
        self.requested: StopReason | None = None
        self._timer: asyncio.TimerHandle | None = None

    @property
    def log(self) -> BatchLog:
        return self.feed.log

    @property
    def fenced(self) -> bool:
        """This attempt may commit nothing more: its lease is gone or the batch already ended."""
        return not self.log.is_current(self.attempt) or self.log.ended is not None

    def stop_reason(self) -> StopReason | None:
        return self.log.stop_reason(time.time()) or self.requested

    def request_stop(self, reason: StopReason) -> None:
        """A FinalizeBatch for this batch reached this executor: the running attempt ends it."""
        self.requested = self.requested or reason
        self.update()

    def update(self) -> None:
        if self.fenced or self.stop_reason() is not None:
            self.stopping.set()
        elif self.log.expires_at is not None and self._timer is None:
            delay = max(0.0, self.log.expires_at - time.time())
            self._timer = asyncio.get_running_loop().call_later(delay, self.update)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


class WatchHub:
    """One feed per batch with attempts here: the first opens it, others join; it closes `linger_s` after the last."""

    def __init__(self, bus: EventBus, linger_s: float = LINGER_S) -> None:
        self.bus = bus
        self.linger_s = linger_s
        self.feeds: dict[str, BatchFeed] = {}
        self.opened = 0
        """Feeds opened (a measure: one read of a batch's log from its first fact each)."""

    @contextlib.asynccontextmanager
    async def watch(self, batch_id: str, attempt: int, expires_at: int | None = None) -> AsyncIterator[BatchWatch]:
        """`expires_at`: from the run command (a log read through the fact desk does not show the batch's creation)."""
        while True:
            feed, opened_here = self._hold(batch_id, expires_at)
            watch = BatchWatch(attempt, feed)
            feed.watches.add(watch)  # from here on the feed stays open for this attempt
            try:
                await asyncio.shield(feed.ready)
                if not opened_here:
                    await feed.catch_up()
                break
            except (nats.errors.Error, OSError, TimeoutError) as error:
                self._drop(feed, watch)
                if opened_here or feed.ready.exception() is not None:
                    raise
                # This feed cannot be brought up to date: a fresh one serves this attempt and those after it.
                log.warning("batch %s: its feed could not be caught up (%r); opening another", batch_id, error)
                feed.broken = True
                self._forget(feed)
            except BaseException:
                self._drop(feed, watch)
                raise
        if feed.log.expires_at is None:
            feed.log.expires_at = expires_at
        watch.update()
        try:
            yield watch
        finally:
            self._drop(feed, watch)

    def _hold(self, batch_id: str, expires_at: int | None) -> tuple[BatchFeed, bool]:
        """The batch's open feed, or one being opened now (True)."""
        feed = self.feeds.get(batch_id)
        if feed is not None:
            if feed.linger is not None:
                feed.linger.cancel()
                feed.linger = None
            return feed, False
        feed = self.feeds[batch_id] = BatchFeed(batch_id, self.bus)
        self.opened += 1
        feed.task = asyncio.create_task(self._keep(feed, expires_at))
        return feed, True

    def _drop(self, feed: BatchFeed, watch: BatchWatch) -> None:
        watch.close()
        feed.watches.discard(watch)
        if feed.watches:
            return
        if feed.broken or feed.ended_here or feed.log.ended is not None or feed.done.is_set() \
                or self.feeds.get(feed.batch_id) is not feed:
            self._forget(feed)
            feed.done.set()
        elif feed.linger is None:
            feed.linger = asyncio.get_running_loop().call_later(self.linger_s, self._expire, feed)

    def _expire(self, feed: BatchFeed) -> None:
        feed.linger = None
        if not feed.watches:
            self._forget(feed)
            feed.done.set()

    def _forget(self, feed: BatchFeed) -> None:
        """The hub no longer hands out this feed (a fresh one may serve the batch already)."""
        if self.feeds.get(feed.batch_id) is feed:
            del self.feeds[feed.batch_id]

    async def _keep(self, feed: BatchFeed, expires_at: int | None) -> None:
        """Open the feed, follow it until it is done, close it; the hub forgets it first."""
        try:
            async with feed.followed(expires_at):
                feed.ready.set_result(None)
                await feed.done.wait()
        except asyncio.CancelledError:
            feed.ready.cancel()
            raise
        except Exception as error:
            if feed.ready.done():
                log.warning("batch %s: closing its feed failed: %r", feed.batch_id, error)
            else:
                feed.ready.set_exception(error)
                feed.ready.exception()  # every joiner raises it; none may be left to retrieve it
        finally:
            self._forget(feed)

    async def close(self) -> None:
        for feed in list(self.feeds.values()):
            feed.done.set()
        tasks = [feed.task for feed in self.feeds.values() if feed.task is not None]
        self.feeds.clear()
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)
