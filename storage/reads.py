"""The log's reads, written once for every backend: all a backend gives is :meth:`LogReads.fetch`.

SQL here is the shared dialect (``?`` placeholders, see
:mod:`storage.postgres.dialect`); each store runs it on its own readers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from protocol.events import decode_event
from storage.queries import Row
from storage.recorder import RecordedEvent

__all__ = ["EVENT_COLUMNS", "LogReads", "record_from_row"]

#: An ``event`` row in the order :func:`record_from_row` reads it.
EVENT_COLUMNS: Final = "position, id, aggregate_id, seq, type, created, data"


def record_from_row(r: Row) -> RecordedEvent:
    return RecordedEvent(
        position=r[0],
        id=r[1],
        aggregate_id=r[2],
        seq=r[3],
        type=r[4],
        created=r[5],
        data=r[6],
        event=decode_event(r[4], r[6]),
    )


class LogReads:
    """``read``, ``read_all`` and ``last_seq`` of the :class:`~storage.EventLog`, over ``fetch``."""

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        """One statement's rows, on a read-only connection."""
        raise NotImplementedError

    async def read(
        self, aggregate_id: str, *, after: int = 0, limit: int = 512
    ) -> list[RecordedEvent]:
        rows = await self.fetch(
            f"SELECT {EVENT_COLUMNS} FROM event WHERE aggregate_id = ? AND seq > ?"
            " ORDER BY seq LIMIT ?",
            (aggregate_id, after, limit),
        )
        return [record_from_row(r) for r in rows]

    async def read_all(self, *, after: int = 0, limit: int = 512) -> list[RecordedEvent]:
        """Events with ``position > after`` in position order (commit order on every backend)."""
        rows = await self.fetch(
            f"SELECT {EVENT_COLUMNS} FROM event WHERE position > ? ORDER BY position LIMIT ?",
            (after, limit),
        )
        return [record_from_row(r) for r in rows]

    async def last_seq(self, aggregate_id: str) -> int:
        rows = await self.fetch(
            "SELECT coalesce(max(seq), 0) FROM event WHERE aggregate_id = ?", (aggregate_id,)
        )
        return int(rows[0][0])
