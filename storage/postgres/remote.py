"""Other processes' commits, read back from the table and handed to this store's subscribers.

The listener hands over each notice (another origin's committed batch, by
position range) in commit order; :meth:`RemoteCommits.deliver` reads each
batch's rows and publishes them, one batch at a time, so subscribers hear
them in commit order. ``cursor`` is the last position handed out this way.
After a lost listen connection (or a notice queue past its bound) nothing
is known about what was missed, so a catch-up reads everything after the
cursor instead, skipping this store's own recent batches (published at
their COMMIT already; the writer owns each batch's range before its
COMMIT, so no row of one is visible before its range is known).
"""

from __future__ import annotations

import asyncio
import logging
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Sequence
from typing import Final

import asyncpg

from storage.errors import StorageBrokenError, StoreClosedError
from storage.postgres._errors import reason as _reason
from storage.postgres.notify import Notice
from storage.queries import Fetch
from storage.reads import EVENT_COLUMNS, record_from_row
from storage.recorder import RecordedEvent

__all__ = ["MAX_NOTICES", "MAX_OWN_RANGES", "RemoteCommits"]

log = logging.getLogger(__name__)

#: Other origins' committed batches waiting to be read back; past this many
#: the queue is dropped and replaced by one catch-up read from the table.
MAX_NOTICES: Final = 4096
#: This store's own recent position ranges, kept so a catch-up read skips
#: them (they were published already); the oldest are forgotten first.
MAX_OWN_RANGES: Final = 4096
_PAGE: Final = 512
_CATCH_UP: Final = None  # a queue entry: read everything after the cursor


class RemoteCommits:
    def __init__(self, fetch: Fetch, publish: Callable[[Sequence[RecordedEvent]], None]) -> None:
        self._fetch = fetch
        self._publish = publish
        self._queue: deque[Notice | None] = deque()
        self._bell = asyncio.Event()
        self._own_ranges: deque[tuple[int, int]] = deque(maxlen=MAX_OWN_RANGES)
        self._cursor = 0

    async def start_after(self, position: int) -> None:
        """Hand out commits after ``position`` (read once the LISTEN is in place)."""
        self._cursor = position

    def own(self, first: int, last: int) -> None:
        """This store's batch at ``first..last``: never hand it out again.

        Told before the batch's COMMIT, in commit order.
        """
        self._own_ranges.append((first, last))

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
                            f"SELECT {EVENT_COLUMNS} FROM event"
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
        while True:
            rows = await self._fetch(
                f"SELECT {EVENT_COLUMNS} FROM event WHERE position > ? ORDER BY position LIMIT ?",
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
