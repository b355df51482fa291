"""Following one aggregate's durable log: replay up to a watermark, then what commits next.

A read-side service over any :class:`~storage.recorder.Recorder`, used by the
SSE ``session.log`` stream (and through it the embedded host and the CLI).
Register for commit notifications *before* reading the watermark (the latest
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

from storage.recorder import RecordedEvent, Recorder

__all__ = ["LogFollow"]

PAGE: Final = 512


class LogFollow:
    """``async with LogFollow(store, id, after=n, follow=True) as log:`` then
    ``async for page in log.replay()`` and ``async for page in log.changes(idle_s)``."""

    def __init__(
        self, recorder: Recorder, aggregate_id: str, *, after: int = 0, follow: bool = False
    ) -> None:
        self._recorder = recorder
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
            self._unsubscribe = self._recorder.subscribe(self._ring)
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

    def _ring(self, records: Sequence[RecordedEvent]) -> None:
        if any(r.aggregate_id == self.aggregate_id for r in records):
            self._bell.set()

    async def replay(self) -> AsyncIterator[list[RecordedEvent]]:
        """Pages of ``cursor < seq <= watermark``."""
        async for page in self._pages(self.watermark):
            yield page
        self.cursor = max(self.cursor, self.watermark)

    async def changes(self, idle_s: float) -> AsyncIterator[list[RecordedEvent]]:
        """Pages committed after the replay; an empty page after ``idle_s`` without one.

        Ends after the aggregate's deletion, or at once after :meth:`close`.
        """
        while not self._ended():
            try:
                async with asyncio.timeout(idle_s):
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
