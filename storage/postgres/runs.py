"""A batch's projector ops grouped by statement into runs, one ``executemany`` per run.

A batch of a hundred commands renaming a hundred sessions makes a hundred
ops of one statement: one run, one round trip. Grouping must not change
what a projector sees, so :func:`runs` keeps the order of every op that
shares a session with another (:func:`storage.batch.keys`): a later
statement may depend on an earlier one's effect. Ops of disjoint sessions
touch disjoint rows, so their order is free.
"""

from __future__ import annotations

import collections
import functools
from bisect import bisect_left
from collections.abc import Iterable, Sequence

import asyncpg

from storage._ops import Op
from storage.postgres.dialect import translate

__all__ = ["run_ops", "runs"]


def runs(ops: Iterable[tuple[frozenset[str], Op]]) -> list[list[Op]]:
    """``ops`` (each with the sessions that order it) as runs of one statement each,
    for one ``executemany`` per run, in the order the runs are to go.

    An op joins the first run of its statement that comes no earlier than
    the latest run holding an op that shares a session with it, else a new
    run at the end. So ops sharing a session keep their order (a later
    statement may depend on an earlier one's effect: an insert of a message,
    then the update of its part), while ops of disjoint sessions, which touch
    disjoint rows (:func:`storage.batch.keys`), are free to share a run with
    ops before them: a hundred commands renaming a hundred sessions make one
    run, one session renamed twice makes two.
    """
    out: list[list[Op]] = []
    by_sql: dict[str, list[int]] = {}
    latest: dict[str, int] = {}
    for names, op in ops:
        floor = max([latest.get(name, 0) for name in names], default=0)
        places = by_sql.setdefault(op.sql, [])
        i = bisect_left(places, floor)
        if i < len(places):
            at = places[i]
        else:
            at = len(out)
            out.append([])
            places.append(at)
        out[at].append(op)
        for name in names:
            latest[name] = at
    return out


async def run_ops(conn: asyncpg.Connection, run: Sequence[Op]) -> Op | None:
    """One statement for every op of ``run``; the first op that touched other
    rows than its ``expect``, or None.

    ``executemany`` discards each execution's row count, so where an op
    expects one, the statement returns the op's index for each row it
    touched, and the rows are counted per op.
    """
    sql = run[0].sql
    if all(op.expect is None for op in run):
        await conn.executemany(translate(sql), [op.params for op in run])
        return None
    rows = await conn.fetchmany(_counted(sql), [(*op.params, i) for i, op in enumerate(run)])
    touched = collections.Counter(row[0] for row in rows)
    for i, op in enumerate(run):
        if op.expect is not None and touched[i] != op.expect:
            return op
    return None


@functools.lru_cache(maxsize=1024)
def _counted(sql: str) -> str:
    """``sql`` returning, for each row it touches, its last parameter (the op's index)."""
    return translate(sql + " RETURNING CAST(? AS INTEGER)")
