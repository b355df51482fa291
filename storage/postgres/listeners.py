"""Who listens for commit notices (the ``log_listener`` table), so a batch NOTIFYs only for them.

A batch's NOTIFY costs the batch, and PostgreSQL wakes every process that
LISTENs on the database for it, the sending store's own listener included
(which then skips its own notice). Measured with one store and 100
producers, it is about a tenth of the appends' throughput; a host alone on
its database needs none of it. So each store lists its LISTEN connection
(its origin and the server process serving it) while it listens, and a
batch NOTIFYs only while another origin is listed (:func:`others_listen`).

**Order.** A store lists itself under the batch lock, once its LISTEN is in
place and before it reads anything (at open, the position it follows from;
after a lost connection, the catch-up: see :class:`.listen.Listener`'s
``on_listening``). A batch reads the table under the same lock, after it
took it. So a batch that commits after the row was written notifies the
store, and one that committed before is in the table by the time the store
reads it: none falls between the two.

**Liveness.** A store that stops deletes its row. A process that dies
leaves it behind, naming a server process that is gone; the next store to
list itself deletes every such row (``pg_stat_activity`` lists the live
ones). Until then batches notify for nothing, as they all did before this
table. A host that is paused keeps its connection, so its row stays and it
is notified as before.

**Hosts of an earlier build** (before schema v15) listen without a row, and
their followers and their executions' wakes rely on every batch's notice.
A store that hears a notice from an origin with no row writes one for it
with no server process and an expiry (:data:`EARLIER_BUILD_TTL_MS` after
its latest notice, renewed as they come: :data:`HEARD`), and batches notify
while it lasts. Such a host hears every commit while it commits itself; one
silent for longer may miss live notices until it commits again (each notice
it reads makes it read everything after its cursor, so none is lost for
good) or is restarted on this build, which is how an upgrade ends anyway.

The statements take the lock's key as a parameter: the batch lock lives in
:mod:`.writer`, which imports this module.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

import asyncpg

from storage.errors import StorageBrokenError

__all__ = [
    "EARLIER_BUILD_TTL_MS",
    "HEARD",
    "MAX_ORIGINS",
    "MAX_UNHEARD",
    "UNLIST",
    "Origins",
    "others_listen",
    "register",
]

log = logging.getLogger(__name__)

#: How long a host of an earlier build counts as listening after its latest notice.
EARLIER_BUILD_TTL_MS: Final = 10 * 60 * 1000
#: Origins looked up (listed, or hosts of an earlier build), remembered; the
#: least recently looked up go first.
MAX_ORIGINS: Final = 1024
#: Origins heard and not looked up yet; past this many, a new one waits for
#: its next notice.
MAX_UNHEARD: Final = 64
_NEVER: Final = float("inf")
#: The server's clock in milliseconds (what ``expires`` is compared with).
_NOW_MS: Final = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"


def others_listen(origin: str) -> str:
    """The condition a batch's NOTIFY waits for: a live row of an origin other
    than the SQL expression ``origin`` (a store's, or a host of an earlier build's)."""
    return (
        f"EXISTS (SELECT 1 FROM log_listener WHERE origin <> {origin}"
        f" AND (pid IS NOT NULL OR expires > {_NOW_MS}))"
    )


_PRUNE: Final = (
    "DELETE FROM log_listener WHERE pid IS NOT NULL"
    " AND pid NOT IN (SELECT pid FROM pg_stat_activity WHERE pid IS NOT NULL)"
    f" OR pid IS NULL AND expires <= {_NOW_MS}"
)
#: A notice came from origin ``$1``: unless it is listed with its process, it
#: is a host of an earlier build, listening until ``$2`` ms from now. Returns
#: true for such a host, nothing for a listed one.
HEARD: Final = (
    "INSERT INTO log_listener (origin, pid, expires)"
    f" VALUES ($1, NULL, {_NOW_MS} + $2::bigint)"
    " ON CONFLICT (origin) DO UPDATE SET expires = excluded.expires"
    " WHERE log_listener.pid IS NULL RETURNING true"
)
_UPSERT: Final = (
    "INSERT INTO log_listener (origin, pid, expires) VALUES ($1, pg_backend_pid(), NULL)"
    " ON CONFLICT (origin) DO UPDATE SET pid = excluded.pid, expires = NULL"
)
#: Deletes origin ``$1``'s row, run on its own listen connection as the store stops.
UNLIST: Final = "DELETE FROM log_listener WHERE origin = $1 AND pid = pg_backend_pid()"


async def register(conn: asyncpg.Connection, origin: str, *, lock: int) -> None:
    """List ``conn`` (LISTENing already) as ``origin``'s, under the batch lock ``lock``;
    rows of server processes that are gone go first."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", lock)
        await conn.execute(_PRUNE)
        await conn.execute(_UPSERT, origin)


class Origins:
    """The origins of the notices a store hears, each looked up once (:data:`HEARD`):
    a listed store is known for good, a host of an earlier build gets a row,
    renewed when it is heard from after half its expiry.

    :meth:`heard` runs for every notice, so it only queues; :meth:`look_up`
    (the store's task) runs the statements on the listen connection
    (``fetchval``). Bounded: :data:`MAX_ORIGINS` remembered,
    :data:`MAX_UNHEARD` queued.
    """

    def __init__(self, fetchval: Callable[..., Awaitable[Any]]) -> None:
        self._fetchval = fetchval
        #: Origin -> the time (monotonic) until which it needs no look-up.
        self._known: collections.OrderedDict[str, float] = collections.OrderedDict()
        self._unheard: set[str] = set()
        self._bell = asyncio.Event()

    def heard(self, origin: str) -> None:
        until = self._known.get(origin)
        if (until is None or until <= time.monotonic()) and len(self._unheard) < MAX_UNHEARD:
            self._unheard.add(origin)
            self._bell.set()

    async def look_up(self) -> None:
        while True:
            await self._bell.wait()
            self._bell.clear()
            while self._unheard:
                origin = self._unheard.pop()
                try:
                    earlier = await self._fetchval(HEARD, origin, EARLIER_BUILD_TTL_MS)
                except StorageBrokenError as exc:
                    # Looked up again at its next notice.
                    log.warning("cannot look up a notice's origin yet: %s", exc)
                    continue
                except Exception:
                    log.exception("looking up a notice's origin failed")
                    continue
                if earlier and origin not in self._known:
                    log.info("a host of an earlier build listens (origin %s)", origin)
                self._known[origin] = (
                    time.monotonic() + EARLIER_BUILD_TTL_MS / 2000 if earlier else _NEVER
                )
                self._known.move_to_end(origin)
                while len(self._known) > MAX_ORIGINS:
                    self._known.popitem(last=False)
