#!/usr/bin/env python3
"""asyncpg next to psycopg 3 (async), on the round trips the PostgreSQL store makes.

    .venv/bin/python scripts/bench_pg_drivers.py            # table
    .venv/bin/python scripts/bench_pg_drivers.py --json
    .venv/bin/python scripts/bench_pg_drivers.py --server postgresql://postgres@127.0.0.1:5432

Why this decides the driver: the store's writer spends a batch on sequential
round trips on one connection (an INSERT of the command's events, then each
projector's statement, each with parameters), and its readers on single
parameterised SELECTs. So each driver, on its own fresh database of the same
server, in the same run and the same table (the store's ``event`` shape):

* insert: one parameterised ``INSERT`` per round trip, all in one transaction
  (the batch's shape: no commit cost in the figure);
* select: one parameterised ``SELECT`` of one row by key per round trip;
* executemany: ``--rows`` rows in one call, one transaction (the bulk baseline).

Both run prepared statements (asyncpg always does; psycopg gets
``prepare_threshold=0``) on a single connection, warmed up first. asyncpg is
the baseline; "psycopg/asyncpg" below 1 means psycopg is slower. When psycopg
is not installed only asyncpg is measured, and the table says so. The figures
depend on the machine's load; compare rows of one run only.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from _benchlib import report_main

_TABLE = (
    "CREATE TABLE event (position BIGSERIAL PRIMARY KEY, id TEXT NOT NULL UNIQUE,"
    " aggregate_id TEXT NOT NULL, seq BIGINT NOT NULL, type TEXT NOT NULL,"
    " created BIGINT NOT NULL, data TEXT NOT NULL, UNIQUE (aggregate_id, seq))"
)
_DATA = '{"title":"a renamed session, about as long as a real one"}'


def _rows(n: int, tag: str) -> list[tuple[Any, ...]]:
    return [
        (f"evt_{tag}_{i}", f"ses_{tag}_{i % 100}", i // 100 + 1, "session.renamed.1", i, _DATA)
        for i in range(n)
    ]


async def _timed(n: int, step: Callable[[int], Awaitable[Any]]) -> float:
    started = time.perf_counter()
    for i in range(n):
        await step(i)
    return n / (time.perf_counter() - started)


async def _asyncpg(url: str, n: int, rows: int) -> dict[str, float]:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        await conn.execute(_TABLE)
        insert = (
            "INSERT INTO event (id, aggregate_id, seq, type, created, data)"
            " VALUES ($1, $2, $3, $4, $5, $6)"
        )
        data = _rows(n, "a")
        await conn.execute("BEGIN")
        warm = _rows(50, "warm")
        await _timed(50, lambda i: conn.execute(insert, *warm[i]))
        ins = await _timed(n, lambda i: conn.execute(insert, *data[i]))
        await conn.execute("COMMIT")
        select = "SELECT position, data FROM event WHERE id = $1"
        await _timed(50, lambda i: conn.fetchrow(select, data[i][0]))
        sel = await _timed(n, lambda i: conn.fetchrow(select, data[i][0]))
        bulk = _rows(rows, "bulk")
        started = time.perf_counter()
        async with conn.transaction():
            await conn.executemany(insert, bulk)
        many = rows / (time.perf_counter() - started)
        return {"insert": ins, "select": sel, "executemany": many}
    finally:
        await conn.close()


async def _psycopg(url: str, n: int, rows: int) -> dict[str, float]:
    import psycopg

    conn = await psycopg.AsyncConnection.connect(url, prepare_threshold=0)
    try:
        await conn.execute(_TABLE)
        await conn.commit()
        insert = (
            "INSERT INTO event (id, aggregate_id, seq, type, created, data)"
            " VALUES (%s, %s, %s, %s, %s, %s)"
        )
        data = _rows(n, "p")
        cur = conn.cursor()
        warm = _rows(50, "warm")
        await _timed(50, lambda i: cur.execute(insert, warm[i]))
        ins = await _timed(n, lambda i: cur.execute(insert, data[i]))
        await conn.commit()
        select = "SELECT position, data FROM event WHERE id = %s"

        async def one(i: int) -> Any:
            await cur.execute(select, (data[i][0],))
            return await cur.fetchone()

        await _timed(50, one)
        sel = await _timed(n, one)
        await conn.commit()
        bulk = _rows(rows, "bulk")
        started = time.perf_counter()
        await cur.executemany(insert, bulk)
        await conn.commit()
        many = rows / (time.perf_counter() - started)
        return {"insert": ins, "select": sel, "executemany": many}
    finally:
        await conn.close()


async def _with_database(server: str, run: Callable[[str], Awaitable[dict[str, float]]]) -> Any:
    import asyncpg

    name = f"sessionrt_bench_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(f"{server}/postgres")
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    try:
        return await run(f"{server}/{name}")
    finally:
        admin = await asyncpg.connect(f"{server}/postgres")
        try:
            await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        finally:
            await admin.close()


def _produce(args: argparse.Namespace) -> dict[str, Any]:
    async def both() -> dict[str, Any]:
        report: dict[str, Any] = {"round_trips": args.n, "rows": args.rows}
        report["asyncpg"] = await _with_database(
            args.server, lambda url: _asyncpg(url, args.n, args.rows)
        )
        try:
            import psycopg  # noqa: F401
        except ImportError:
            report["psycopg"] = None
        else:
            report["psycopg"] = await _with_database(
                args.server, lambda url: _psycopg(url, args.n, args.rows)
            )
        return report

    return asyncio.run(both())


def _render(report: dict[str, Any]) -> str:
    a = report["asyncpg"]
    p = report["psycopg"]
    lines = [
        f"{report['round_trips']} round trips each, executemany of {report['rows']} rows",
        f"{'per second':<14}{'asyncpg':>12}{'psycopg 3':>12}{'psycopg/asyncpg':>18}",
    ]
    for key in ("insert", "select", "executemany"):
        if p is None:
            lines.append(f"{key:<14}{a[key]:>12,.0f}{'-':>12}{'-':>18}")
        else:
            lines.append(f"{key:<14}{a[key]:>12,.0f}{p[key]:>12,.0f}{p[key] / a[key]:>18.2f}")
    if p is None:
        lines.append("psycopg is not installed: only asyncpg was measured")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", default="postgresql://postgres@127.0.0.1:5432")
    parser.add_argument("-n", type=int, default=5000, help="round trips per measurement")
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    return report_main(lambda: _produce(args), _render, as_json=args.json, hard_limit_s=300)


if __name__ == "__main__":
    sys.exit(main())
