"""Other processes' commits, read back from the table and handed to this store's subscribers.

The listener hands over each notice (another origin's committed batch, by
position range) in commit order; :meth:`RemoteCommits.deliver` reads each
batch's rows and publishes them, one batch at a time, so subscribers hear
them in commit order. ``cursor`` is the last position handed out this way.
After a lost listen connection (or a notice queue past its bound) nothing
is known about what was missed, so a catch-up reads everything after the
cursor instead, skipping this store's own recent batches (published at
their COMMIT already; a catch-up never reads while one of them commits, so
their ranges are known by then: :class:`CommitGate`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from bisect import bisect_right
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Final

import asyncpg

from storage.errors import StorageBrokenError, StoreClosedError
from storage.postgres._errors import reason as _reason
from storage.postgres.notify import Notice
from storage.queries import Fetch
from storage.reads import record_from_row
from storage.recorder import RecordedEvent

__all__ = ["MAX_NOTICES", "MAX_OWN_RANGES", "CommitGate", "RemoteCommits"]

log = logging.getLogger(__name__)

#: Other origins' committed batches waiting to be read back; past this many
#: the queue is dropped and replaced by one catch-up read from the table.
MAX_NOTICES: Final = 4096
#: This store's own recent position ranges, kept so a catch-up read skips
#: them (they were published already); the oldest are forgotten first.
MAX_OWN_RANGES: Final = 4096
_PAGE: Final = 512
_CATCH_UP: Final = None  # a queue entry: read everything after the cursor
_EVENT_COLUMNS: Final = "position, id, aggregate_id, seq, type, created, data"


class CommitGate:
    """Any number of this store's batches committing, or one catch-up read: never both.

    A catch-up closes the gate to new commits, waits for the running ones to
    finish (their ranges are owned by then), reads, and opens it again.
    """

    def __init__(self) -> None:
        self._commits = 0
        #: Set while no commit runs.
        self._idle = asyncio.Event()
        self._idle.set()
        #: Set while no catch-up runs (or waits to).
        self._open = asyncio.Event()
        self._open.set()

    @contextlib.asynccontextmanager
    async def commit(self) -> AsyncIterator[None]:
        while not self._open.is_set():
            await self._open.wait()
        self._commits += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._commits -= 1
            if self._commits == 0:
                self._idle.set()

    @contextlib.asynccontextmanager
    async def catch_up(self) -> AsyncIterator[None]:
        """For one caller at a time (the delivery task)."""
        self._open.clear()
        try:
            await self._idle.wait()
            yield
        finally:
            self._open.set()


class RemoteCommits:
    def __init__(self, fetch: Fetch, publish: Callable[[Sequence[RecordedEvent]], None]) -> None:
        self._fetch = fetch
        self._publish = publish
        self._queue: deque[Notice | None] = deque()
        self._bell = asyncio.Event()
        self._own_ranges: deque[tuple[int, int]] = deque(maxlen=MAX_OWN_RANGES)
        #: Passed by the store's writer lanes while a batch commits, until its
        #: range is owned; a catch-up reads with it closed, so it never sees an
        #: unowned batch of this store (the fast path learns its range only
        #: after COMMIT).
        self.gate = CommitGate()
        self._cursor = 0

    async def start_after(self, position: int) -> None:
        """Hand out commits after ``position`` (read once the LISTEN is in place)."""
        self._cursor = position

    def own(self, first: int, last: int) -> None:
        """This store's batch at ``first..last``: never hand it out again.

        Two writer lanes may tell their ranges out of position order (each
        learns its own when its answer arrives); the ranges stay sorted.
        """
        own = self._own_ranges
        if not own or own[-1][0] < first:
            own.append((first, last))
            return
        if len(own) == own.maxlen:
            own.popleft()
        own.insert(bisect_right(own, (first, last)), (first, last))

    def noticed(self, notice: Notice) -> None:
        if len(self._queue) >= MAX_NOTICES:
            self._queue.clear()
            self._queue.append(_CATCH_UP)
        elif not self._queue or self._queue[-1] != notice:
            self._queue.append(notice)
        self._bell.set()

    def lost_notices(self) -> None:
        """Notices may have been missed while not listening: read the table instead."""
        self._queue.append(_CATCH_UP)
        self._bell.set()

    async def deliver(self) -> None:
        """Other origins' commits, read back from the table, to the subscribers, in order."""
        while True:
            await self._bell.wait()
            self._bell.clear()
            while self._queue:
                notice = self._queue.popleft()
                try:
                    if notice is None:
                        await self._catch_up()
                    elif notice.last > self._cursor:
                        rows = await self._fetch(
                            f"SELECT {_EVENT_COLUMNS} FROM event"
                            " WHERE position > ? AND position <= ? ORDER BY position",
                            (max(notice.first - 1, self._cursor), notice.last),
                        )
                        self._cursor = notice.last
                        self._hand_out([record_from_row(r) for r in rows])
                except StoreClosedError:
                    return  # the store is closing: nobody is handed anything more
                except (
                    StorageBrokenError,
                    OSError,
                    asyncpg.PostgresError,
                    asyncpg.InterfaceError,
                ) as exc:
                    log.warning("cannot read announced commits yet: %s", _reason(exc))
                    self._queue.appendleft(_CATCH_UP)
                    await asyncio.sleep(0.1)

    async def _catch_up(self) -> None:
        async with self.gate.catch_up():
            await self._catch_up_owned()

    async def _catch_up_owned(self) -> None:
        while True:
            rows = await self._fetch(
                f"SELECT {_EVENT_COLUMNS} FROM event WHERE position > ? ORDER BY position LIMIT ?",
                (self._cursor, _PAGE),
            )
            if not rows:
                return
            self._cursor = int(rows[-1][0])
            self._hand_out([record_from_row(r) for r in rows if not self._is_own(int(r[0]))])
            if len(rows) < _PAGE:
                return

    def _is_own(self, position: int) -> bool:
        own = self._own_ranges
        i = bisect_right(own, (position, float("inf"))) - 1
        return i >= 0 and own[i][0] <= position <= own[i][1]

    def _hand_out(self, records: list[RecordedEvent]) -> None:
        while self._own_ranges and self._own_ranges[0][1] <= self._cursor:
            self._own_ranges.popleft()
        if records:
            self._publish(records)
