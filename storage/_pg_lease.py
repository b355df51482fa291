"""Leases and fencing on PostgreSQL: the twin of the lease steps in :mod:`storage._writer`.

Called inside each command's SAVEPOINT of a PostgreSQL batch, before the
command's events (:func:`use_lease`) and after them (:func:`fence_records`),
with the same rules as on SQLite (see :mod:`storage.lease`). What differs is
the clock: every host reads the database's (``clock_timestamp()``), so hosts
whose own clocks disagree still agree on whether a lease expired.
"""

from __future__ import annotations

from typing import Any, Final

import attrs

from storage.errors import FencedError, LeaseHeldError
from storage.lease import LeaseUse
from storage.recorder import RecordedEvent

__all__ = ["LEASE_SCHEMA", "fence_records", "use_lease"]

_NOW: Final = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"

#: Schema v9 on PostgreSQL (the twin of :data:`storage.schema._V9`).
LEASE_SCHEMA: Final = """
CREATE TABLE session_lease (
    session_id TEXT PRIMARY KEY,
    host_id    TEXT NOT NULL,
    epoch      BIGINT NOT NULL CHECK (epoch >= 1),
    expires    BIGINT NOT NULL
);
CREATE INDEX session_lease_host ON session_lease (host_id, expires);

CREATE TABLE event_fence (
    position   BIGINT PRIMARY KEY,
    session_id TEXT NOT NULL,
    host_id    TEXT NOT NULL,
    epoch      BIGINT NOT NULL
);
CREATE INDEX event_fence_session ON event_fence (session_id, epoch);
"""

_TAKE: Final = (
    "INSERT INTO session_lease (session_id, host_id, epoch, expires)"
    f" VALUES ($1, $2, 1, {_NOW} + $3)"
    " ON CONFLICT (session_id) DO UPDATE SET host_id = excluded.host_id,"
    " epoch = session_lease.epoch + 1, expires = excluded.expires"
    f" WHERE session_lease.expires <= {_NOW} OR session_lease.host_id = excluded.host_id"
    " RETURNING epoch"
)
# FOR UPDATE: a check and the append it guards see one version of the row,
# whatever else the database runs meanwhile.
_READ: Final = (
    f"SELECT host_id, epoch, expires, {_NOW} FROM session_lease WHERE session_id = $1 FOR UPDATE"
)
_RENEW: Final = f"UPDATE session_lease SET expires = {_NOW} + $2 WHERE session_id = $1"
_RELEASE: Final = "UPDATE session_lease SET expires = 0 WHERE session_id = $1"
_FENCE: Final = (
    "INSERT INTO event_fence (position, session_id, host_id, epoch)"
    " SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[])"
)


async def use_lease(conn: Any, use: LeaseUse) -> int:
    """Take, check, renew or release ``use``'s lease; the epoch the command holds.

    ``conn`` is an ``asyncpg.Connection`` inside the command's savepoint.
    """
    if use.kind == "take":
        epoch = await conn.fetchval(_TAKE, use.session_id, use.host_id, use.ttl_ms)
        if epoch is not None:
            return int(epoch)
        held = await conn.fetchrow(_READ, use.session_id)
        raise LeaseHeldError(use.session_id, str(held[0]), int(held[1]))
    held = await conn.fetchrow(_READ, use.session_id)
    if held is None:
        raise FencedError(use.session_id, use.host_id, use.epoch, "no lease was taken")
    if (str(held[0]), int(held[1])) != (use.host_id, use.epoch):
        raise FencedError(
            use.session_id, use.host_id, use.epoch, f"host {held[0]} holds epoch {held[1]}"
        )
    if int(held[2]) <= int(held[3]):
        raise FencedError(use.session_id, use.host_id, use.epoch, "the lease expired")
    if use.kind == "renew":
        await conn.execute(_RENEW, use.session_id, use.ttl_ms)
    elif use.kind == "release":
        await conn.execute(_RELEASE, use.session_id)
    return use.epoch


async def fence_records(
    conn: Any, use: LeaseUse, epoch: int, records: list[RecordedEvent]
) -> list[RecordedEvent]:
    """Record who wrote the lease's session's events; the appender's copies carry the epoch."""
    mine = [r for r in records if r.aggregate_id == use.session_id]
    if mine:
        await conn.execute(
            _FENCE,
            [r.position for r in mine],
            [use.session_id] * len(mine),
            [use.host_id] * len(mine),
            [epoch] * len(mine),
        )
    return [
        attrs.evolve(r, epoch=epoch) if r.aggregate_id == use.session_id else r for r in records
    ]
