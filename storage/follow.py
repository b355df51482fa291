"""Following one aggregate's durable log: replay up to a watermark, then what commits next.

A read-side service over any :class:`~storage.recorder.Recorder`, used by the
SSE ``session.log`` stream (and through it the embedded host and the CLI).
One :class:`FollowDispatcher` per store subscribes to the log once (while any
follow is open) and rings only the follows of the aggregates a committed batch
touches: an index aggregate id -> bells, one entry per open follow, so a
commit costs the same whatever the number of followers of other sessions.
Each follow registers for commit notifications *before* reading the watermark (the latest
seq), so nothing committed after it is missed; replay ``after < seq <=
watermark`` in pages; then, following, read again from the last seq seen on
every notification. The notification is only a doorbell (a flag, not a
queue), so a slow reader never buffers events in memory and can never miss
one: everything comes from the log itself, deduplicated by seq. A follow ends
after the aggregate's ``session.deleted`` event, or when closed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from types import TracebackType
from typing import Final, Self

from storage.clock import SYSTEM, Clock
from storage.recorder import RecordedEvent, Recorder

__all__ = ["FollowDispatcher", "LogFollow"]

PAGE: Final = 512


class FollowDispatcher:
    """The per-store index of open follows: ``dispatcher.follow(id, after=n, follow=True)``.

    Holds one entry per open follow (a set of bells per followed aggregate,
    removed with its last follow) and one subscription to the recorder while
    any follow is open.
    """

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self._bells: dict[str, set[asyncio.Event]] = {}
        self._unsubscribe: Callable[[], None] | None = None

    def follow(self, aggregate_id: str, *, after: int = 0, follow: bool = False) -> LogFollow:
        """A follow of ``aggregate_id`` from ``after`` (use it with ``async with``)."""
        return LogFollow(self, aggregate_id, after=after, follow=follow)

    @property
    def open_follows(self) -> int:
        return sum(len(bells) for bells in self._bells.values())

    def register(self, aggregate_id: str, bell: asyncio.Event) -> Callable[[], None]:
        """Set ``bell`` after each commit touching ``aggregate_id``; returns the undo."""
        if self._unsubscribe is None:
            self._unsubscribe = self.recorder.subscribe(self._ring)
        self._bells.setdefault(aggregate_id, set()).add(bell)

        def unregister() -> None:
            bells = self._bells.get(aggregate_id)
            if bells is None or bell not in bells:
                return
            bells.discard(bell)
            if not bells:
                del self._bells[aggregate_id]
            if not self._bells and self._unsubscribe is not None:
                self._unsubscribe()
                self._unsubscribe = None

        return unregister

    def _ring(self, records: Sequence[RecordedEvent]) -> None:
        bells = self._bells
        if not bells:
            return
        last = None
        for record in records:
            aggregate = record.aggregate_id
            if aggregate == last:
                continue  # a batch is mostly runs of one aggregate
            last = aggregate
            for bell in bells.get(aggregate, ()):
                bell.set()


class LogFollow:
    """``async with dispatcher.follow(id, after=n, follow=True) as log:`` then
    ``async for page in log.replay()`` and ``async for page in log.changes(idle_s)``."""

    def __init__(
        self,
        dispatcher: FollowDispatcher,
        aggregate_id: str,
        *,
        after: int = 0,
        follow: bool = False,
    ) -> None:
        self._dispatcher = dispatcher
        self._recorder = dispatcher.recorder
        self.aggregate_id = aggregate_id
        self.follow = follow
        #: The last seq handed out (or skipped as unknown): the cursor.
        self.cursor = after
        #: The latest seq when the follow opened (0 for an empty log).
        self.watermark = 0
        #: Set once the aggregate's deletion has been handed out: nothing follows it.
        self.deleted = False
        self._closed = False
        self._bell = asyncio.Event()
        self._unsubscribe: Callable[[], None] | None = None

    async def __aenter__(self) -> Self:
        if self.follow:
            self._unsubscribe = self._dispatcher.register(self.aggregate_id, self._bell)
        try:
            self.watermark = await self._recorder.last_seq(self.aggregate_id)
        except BaseException:
            self._close_subscription()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._close_subscription()

    def _close_subscription(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def close(self) -> None:
        """End :meth:`changes` now (after the page in hand), not at the next commit."""
        self._closed = True
        self._bell.set()

    def _ended(self) -> bool:
        return self.deleted or self._closed

    async def replay(self) -> AsyncIterator[list[RecordedEvent]]:
        """Pages of ``cursor < seq <= watermark``."""
        async for page in self._pages(self.watermark):
            yield page
        self.cursor = max(self.cursor, self.watermark)

    async def changes(
        self, idle_s: float, clock: Clock = SYSTEM
    ) -> AsyncIterator[list[RecordedEvent]]:
        """Pages committed after the replay; an empty page after ``idle_s`` (on
        ``clock``) without one.

        Ends after the aggregate's deletion, or at once after :meth:`close`.
        """
        while not self._ended():
            try:
                async with clock.timeout(idle_s):
                    await self._bell.wait()
            except TimeoutError:
                yield []
                continue
            if self._ended():
                return
            self._bell.clear()
            async for page in self._pages(None):
                yield page

    async def _pages(self, upto: int | None) -> AsyncIterator[list[RecordedEvent]]:
        while not self.deleted and (upto is None or self.cursor < upto):
            records = await self._recorder.read(self.aggregate_id, after=self.cursor, limit=PAGE)
            full = len(records) == PAGE
            if upto is not None:
                records = [r for r in records if r.seq <= upto]
            if not records:
                return
            self.cursor = records[-1].seq
            self.deleted = any(r.type.startswith("session.deleted.") for r in records)
            yield records
            if not full:
                return
