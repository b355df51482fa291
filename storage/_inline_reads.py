"""Short SQLite reads on the event loop's own thread, within a time budget.

A read on an aiosqlite reader thread costs the loop little CPU of its own, but
the sqlite3 module drops the GIL around every step of every statement, and a
thread that wants it back while the loop is busy waits for the loop to let
go: one hand-off per row, each a context switch or two. With 100 sessions
stepping (``scripts/bench_runtime.py`` phase 2) that was about 60 context
switches per step, and the GIL ping-pong cost more CPU than the reads.

Most of the runtime's reads are small and hit SQLite's and the OS's page
caches: the inbox at a boundary, the history rows changed since the last
step, a session row. :class:`InlineReader` runs such a read right on the
loop, on a connection of its own, and stops it when it runs past
:data:`BUDGET_S` of SQLite work: a progress handler, called every
:data:`CHECK_EVERY` virtual machine instructions, interrupts the statement,
the read transaction is rolled back, and the caller gets None and sends the
read to a reader thread as before. A read the database answers with BUSY
(the connection waits for no lock: ``timeout=0``) goes there too. So the
loop spends at most about the budget on a read that is not small, plus one
page read from disk if the page was not cached (SQLite cannot be interrupted
inside a system call); the loop-lag figures of ``bench_runtime`` show it.

Only the loop's thread uses the connection, one read at a time (a read never
awaits), so it needs no lock. It is read-only (``query_only``; ``mode=ro``
for a read-only store). Its caches are those of any connection: sqlite3's
prepared statements (128, by count, the module's default) and SQLite's page
cache (``cache_size``, by bytes, as for the readers).
"""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Sequence
from typing import Any, Final

__all__ = ["BUDGET_S", "CHECK_EVERY", "InlineReader"]

#: SQLite work a read may do on the loop before it moves to a reader thread.
BUDGET_S: Final = 0.001
#: Virtual machine instructions between two looks at the clock (about 10-20 us
#: of SQLite work; each look costs well under a microsecond).
CHECK_EVERY: Final = 1000

Row = Any


class InlineReader:
    """One read-only connection, used on the loop's thread; see the module docstring."""

    def __init__(self, path: str, *, read_only: bool, budget_s: float = BUDGET_S) -> None:
        self._target = f"file:{path}?mode=ro" if read_only else path
        self._uri = read_only
        self.budget_s = budget_s
        self._conn: sqlite3.Connection | None = None
        self._deadline = 0.0
        #: Reads answered here, and reads sent on to a thread (past the budget or BUSY).
        self.answered = 0
        self.deferred = 0

    def adopt(self, conn: sqlite3.Connection) -> None:
        """Use ``conn``, made by :meth:`connect` on some other thread (opening a
        file may block, so not on the loop's)."""
        self._conn = conn

    def connect(self) -> sqlite3.Connection:
        """A connection for :meth:`adopt`; blocking."""
        conn = sqlite3.connect(
            self._target,
            uri=self._uri,
            isolation_level=None,
            timeout=0,  # never wait for a lock on the loop: BUSY sends the read on
            check_same_thread=False,  # opened here, used on the loop's thread only
        )
        try:
            conn.execute("PRAGMA query_only = ON")
            conn.set_progress_handler(self._over_budget, CHECK_EVERY)
        except BaseException:
            conn.close()
            raise
        return conn

    def _over_budget(self) -> bool:
        return time.perf_counter() > self._deadline

    def fetch_many(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[list[Row]] | None:
        """Each statement's rows from one snapshot, or None: read it on a thread."""
        conn = self._conn
        if conn is None:
            return None
        self._deadline = time.perf_counter() + self.budget_s
        try:
            conn.execute("BEGIN")
            out = [conn.execute(sql, params).fetchall() for sql, params in statements]
        except sqlite3.OperationalError:
            # Interrupted past the budget, or BUSY: end the read transaction
            # and let a thread read it.
            self._end(conn, "ROLLBACK")
            self.deferred += 1
            return None
        except BaseException:
            self._end(conn, "ROLLBACK")
            raise
        self._end(conn, "COMMIT")
        self.answered += 1
        return out

    def _end(self, conn: sqlite3.Connection, statement: str) -> None:
        """End the read transaction, whatever the budget says."""
        self._deadline = math.inf
        if not conn.in_transaction:
            return
        try:
            conn.execute(statement)
        except sqlite3.Error:
            self.close()  # in an unknown state: every later read goes to a thread

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
