#!/usr/bin/env python3
"""asyncpg next to psycopg 3 (async), on the round trips the PostgreSQL store makes.

    .venv/bin/python scripts/bench_pg_drivers.py            # table
    .venv/bin/python scripts/bench_pg_drivers.py --json
    .venv/bin/python scripts/bench_pg_drivers.py --server postgresql://postgres@127.0.0.1:5432
    .venv/bin/python scripts/bench_pg_drivers.py --admissions 1000 --batches 40 --rounds 4

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

Then the store's write transaction itself (see the comment above
``_asyncpg_tx``), on the schema the store migrates, in one fresh database,
the cases taking turns (``--rounds``, a new order each round; a warm-up
round first): an admission's transaction one after another (p50, p99,
transactions/s) as the store's ``commit_batch`` runs it, as plain
sequential asyncpg awaits, on psycopg without and with pipeline mode; and
``store.append`` of the same command on a PostgresStore and on a
SQLiteStore (``synchronous=FULL``), the figure the admission target
compares. Then a transaction of 100 such commands (the group-commit shape),
one statement per run of ops: asyncpg ``executemany`` per run vs psycopg
pipeline with ``executemany``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

from _benchlib import percentile, report_main

from protocol import ids

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


# -- the store's write transaction --------------------------------------------------------------
#
# An admission (``POST /session/{id}/prompt``) is one command: an
# ``InboxEnqueued`` with the check ``no_staged_revert``. The store's writer
# commits it as six round trips on one asyncpg connection (traced on a real
# app): ``BEGIN; SELECT pg_advisory_xact_lock(k)``, the events' INSERT
# (``writer.INSERT_EVENTS``, RETURNING each event's position and seq), the
# three ops in three runs (the check's no-op UPDATE of the session, the
# touch's UPDATE of it, the INSERT into ``session_inbox``, which takes the
# event's seq: so the ops wait for the INSERT's answer), each as a statement
# RETURNING the op's index for its row count, and COMMIT. Each case below runs
# those statements (the store's own text, the ops the store's projectors give)
# on the schema the store migrates, one transaction after another on one
# connection; the cases take turns, ``--rounds`` times, in a new order each
# round, so load that drifts slows all alike.

_BATCH: Final = 100
_ORIGIN: Final = "bench"


def _admission(session_id: str, text: str) -> Any:
    from protocol import events as ev
    from storage import Command
    from storage._ops import no_staged_revert
    from storage.batch import prepare

    event = ev.InboxEnqueued(
        session_id=session_id,
        inbox_id=ids.message_id(),
        item=ev.EnqueuedItem(type="user", payload={"text": text}, delivery="steer"),
    )
    return prepare(Command.of(event, checks=(no_staged_revert(session_id),)))


def _event_args(batch: Sequence[Any]) -> tuple[Any, ...]:
    """INSERT_EVENTS's parameters for one-event commands (each on its own session)."""
    cols: list[list[Any]] = [[], [], [], [], [], []]
    for prepared in batch:
        new = prepared.command.events[0]
        type_, data = prepared.encoded[0]
        for col, value in zip(
            cols, (new.id, new.aggregate_id, 1, type_, new.created, data), strict=True
        ):
            col.append(value)
    return (len(batch), *cols, _ORIGIN)


def _op_runs(batch: Sequence[Any], rows: Sequence[Sequence[Any]]) -> list[list[Any]]:
    """The batch's ops (checks, then projections of the records the INSERT
    returned) grouped into runs, as the store's writer does."""
    from storage.batch import keys
    from storage.postgres.runs import runs
    from storage.projectors import project
    from storage.recorder import RecordedEvent

    stored = {r[0]: (r[1], r[2]) for r in rows}
    ops = []
    for prepared in batch:
        command = prepared.command
        new = command.events[0]
        type_, data = prepared.encoded[0]
        position, seq = stored[new.id]
        record = RecordedEvent(
            position=position,
            id=new.id,
            aggregate_id=new.aggregate_id,
            seq=seq,
            type=type_,
            created=new.created,
            data=data,
            event=new.event,
        )
        names = keys(prepared)
        ops += [(names, op) for op in (*command.checks, *project(record))]
    return runs(ops)


def _counted(run: Sequence[Any]) -> tuple[str, list[tuple[Any, ...]]]:
    from storage.postgres.runs import _counted as counted

    return counted(run[0].sql), [(*op.params, i) for i, op in enumerate(run)]


def _refused(run: Sequence[Any], indexes: Sequence[int]) -> bool:
    touched = collections.Counter(indexes)
    return any(op.expect is not None and touched[i] != op.expect for i, op in enumerate(run))


class _Refused(Exception):
    pass


async def _asyncpg_tx(conn: Any, batch: Sequence[Any]) -> None:
    """As the store's writer: six round trips for one command (one per run of ops)."""
    from storage.postgres.runs import run_ops
    from storage.postgres.writer import INSERT_EVENTS

    await conn.execute(_BEGIN_LOCK)
    rows = await conn.fetch(INSERT_EVENTS, *_event_args(batch))
    for run in _op_runs(batch, rows):
        if await run_ops(conn, run) is not None:
            raise _Refused
    await conn.execute("COMMIT")


async def _psycopg_send(conn: Any, run: Sequence[Any]) -> Any:
    import psycopg

    cur = psycopg.AsyncRawCursor(conn)
    sql, params = _counted(run)
    if len(params) == 1:
        await cur.execute(sql, params[0])
    else:
        await cur.executemany(sql, params, returning=True)
    return cur


async def _psycopg_check(cur: Any, run: Sequence[Any]) -> None:
    indexes = []
    while True:
        indexes += [row[0] for row in await cur.fetchall()]
        if not cur.nextset():
            break
    if _refused(run, indexes):
        raise _Refused


async def _psycopg_tx(conn: Any, batch: Sequence[Any]) -> None:
    """The same statements, one round trip each (``executemany`` pipelines a run's rows)."""
    import psycopg

    from storage.postgres.writer import INSERT_EVENTS

    cur = psycopg.AsyncRawCursor(conn)
    await cur.execute(_BEGIN_LOCK, prepare=False)  # two statements: simple protocol
    await cur.execute(INSERT_EVENTS, _event_args(batch))
    for run in _op_runs(batch, await cur.fetchall()):
        await _psycopg_check(await _psycopg_send(conn, run), run)
    await cur.execute("COMMIT")


async def _pipeline_tx(conn: Any, pipeline: Any, batch: Sequence[Any], *, syncs: int) -> None:
    """The same statements in pipeline mode (``conn`` is in it for good, as a
    writer's connection would be), a round trip per ``sync``:

    3: BEGIN, lock, INSERT | the runs | COMMIT. The ops wait for the INSERT's
    seqs and their row counts are checked before COMMIT (the store's rules).
    2: BEGIN, lock, INSERT | the runs and COMMIT. The row counts are checked
    after COMMIT, too late to roll a refused command back: a bound only.
    """
    import psycopg

    from storage.postgres.writer import INSERT_EVENTS

    cur = psycopg.AsyncRawCursor(conn)
    await cur.execute("BEGIN")
    await cur.execute(_LOCK)
    await cur.execute(INSERT_EVENTS, _event_args(batch))
    await pipeline.sync()
    runs = _op_runs(batch, await cur.fetchall())
    sent = [(await _psycopg_send(conn, run), run) for run in runs]
    if syncs == 2:
        await cur.execute("COMMIT")
    await pipeline.sync()
    for sent_cur, run in sent:
        await _psycopg_check(sent_cur, run)
    if syncs == 3:
        await cur.execute("COMMIT")
        await pipeline.sync()


async def _store_tx(conn: Any, batch: Sequence[Any]) -> None:
    """The store's own ``commit_batch`` on the asyncpg connection (its Python included)."""
    from storage.postgres.writer import commit_batch

    await commit_batch(conn, batch, channel="bench", origin=_ORIGIN, own=lambda a, b: None)


_LOCK: Final = "SELECT pg_advisory_xact_lock(8315179226587162368)"  # writer.LOG_LOCK
_BEGIN_LOCK: Final = f"BEGIN; {_LOCK}"


async def _sessions(conn: Any, count: int, tag: str) -> list[str]:
    """``count`` sessions made by the store's writer (their rows as the store makes them)."""
    from protocol import Location
    from protocol import events as ev
    from storage import Command
    from storage.batch import prepare

    names = [f"ses_{tag}{i:04d}" for i in range(count)]
    loc = Location(directory="/")
    created = [
        prepare(Command.of(ev.SessionCreated(session_id=s, title="t", location=loc))) for s in names
    ]
    await _store_tx(conn, created)
    return names


async def _write_cases(server: str, args: argparse.Namespace) -> dict[str, Any]:
    """Every case of the write transaction, taking turns on one fresh database."""
    import tempfile

    import asyncpg

    from protocol import Location
    from protocol import events as ev
    from storage import Command, connect
    from storage.postgres import schema

    async def run(url: str) -> dict[str, Any]:
        conn = await asyncpg.connect(url, max_cached_statement_lifetime=0)
        await schema.migrate(conn)
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(conn.close)
            plain = piped = pipe = None
            try:
                import psycopg
            except ImportError:
                pass
            else:
                plain, piped = [
                    await psycopg.AsyncConnection.connect(url, autocommit=True, prepare_threshold=0)
                    for _ in range(2)
                ]
                stack.push_async_callback(plain.close)
                stack.push_async_callback(piped.close)
                pipe = await stack.enter_async_context(piped.pipeline())
            tmp = stack.enter_context(tempfile.TemporaryDirectory())
            pg_store = connect(url)
            await pg_store.open()
            stack.push_async_callback(pg_store.close)
            lite = connect(f"{tmp}/lite.db", synchronous="FULL")
            await lite.open()
            stack.push_async_callback(lite.close)
            return await _turns(
                conn, plain, (piped, pipe), {"postgres": pg_store, "sqlite": lite}, args
            )
        raise AssertionError("unreachable")

    async def _turns(
        conn: Any,
        plain: Any,
        piped: tuple[Any, Any],
        stores: dict[str, Any],
        args: argparse.Namespace,
    ) -> dict[str, Any]:
        single: dict[str, Callable[[Sequence[Any]], Awaitable[None]]] = {
            "asyncpg, store's commit_batch": lambda b: _store_tx(conn, b),
            "asyncpg, sequential awaits": lambda b: _asyncpg_tx(conn, b),
        }
        batched = dict(single)
        if plain is not None:
            single["psycopg, no pipeline"] = lambda b: _psycopg_tx(plain, b)
            single["psycopg pipeline, 3 syncs"] = lambda b: _pipeline_tx(*piped, b, syncs=3)
            single["psycopg pipeline, 2 syncs (bound)"] = lambda b: _pipeline_tx(*piped, b, syncs=2)
            batched["psycopg pipeline, 3 syncs"] = single["psycopg pipeline, 3 syncs"]
        loc = Location(directory="/")
        for name, store in stores.items():
            for i in range(_BATCH):
                sid = f"ses_{name[:4]}{i:04d}"
                await store.append(
                    Command.of(ev.SessionCreated(session_id=sid, title="t", location=loc))
                )

        async def via_store(store: Any, batch: Sequence[Any]) -> None:
            await store.append(batch[0].command)

        for name, store in stores.items():
            single[f"store.append ({name})"] = lambda b, s=store: via_store(s, b)
        one_sessions = {
            name: await _sessions(conn, _BATCH, f"a{k}") for k, name in enumerate(single)
        }
        for name in stores:
            one_sessions[f"store.append ({name})"] = [
                f"ses_{name[:4]}{i:04d}" for i in range(_BATCH)
            ]
        many_sessions = {
            name: await _sessions(conn, _BATCH, f"b{k}") for k, name in enumerate(batched)
        }
        lat: dict[str, list[float]] = {name: [] for name in single}
        blat: dict[str, list[float]] = {name: [] for name in batched}
        # This thread's CPU (the loop's: the driver's and the cases' Python) per case.
        cpus = dict.fromkeys(single, 0.0)
        bcpus = dict.fromkeys(batched, 0.0)
        per = max(1, args.admissions // args.rounds)
        bper = max(1, args.batches // args.rounds)
        for n in range(args.rounds + 1):  # round 0 warms up, uncounted
            order = list(single) if n % 2 == 0 else list(single)[::-1]
            for name in order:
                sessions = one_sessions[name]
                for i in range(per if n else 20):
                    batch = [_admission(sessions[i % _BATCH], f"prompt {n}.{i}")]
                    started, cpu = time.perf_counter(), time.thread_time()
                    await single[name](batch)
                    if n:
                        lat[name].append(time.perf_counter() - started)
                        cpus[name] += time.thread_time() - cpu
            order = list(batched) if n % 2 == 0 else list(batched)[::-1]
            for name in order:
                sessions = many_sessions[name]
                for i in range(bper if n else 2):
                    batch = [_admission(s, f"prompt {n}.{i}") for s in sessions]
                    started, cpu = time.perf_counter(), time.thread_time()
                    await batched[name](batch)
                    if n:
                        blat[name].append(time.perf_counter() - started)
                        bcpus[name] += time.thread_time() - cpu
        # Every case committed what it was given (a case that skipped a write
        # would look fast): the admissions on PostgreSQL, each one inbox row.
        committed = 20 * (len(single) - 1) + per * args.rounds * (len(single) - 1)
        committed += (2 + bper * args.rounds) * _BATCH * len(batched)
        found = await conn.fetchval("SELECT count(*) FROM session_inbox")
        assert found == committed, (found, committed)
        return {"single": lat, "batch": blat, "cpu": cpus, "bcpu": bcpus}

    report = await _with_database(server, run)
    return {
        "admission": {
            name: _stats(v, 1, report["cpu"][name]) for name, v in report["single"].items()
        },
        "batch": {
            name: _stats(v, _BATCH, report["bcpu"][name]) for name, v in report["batch"].items()
        },
    }


def _stats(seconds: Sequence[float], commands: int, cpu_s: float) -> dict[str, float]:
    return {
        "transactions": len(seconds),
        "cpu_ms_per_tx": cpu_s / len(seconds) * 1000,
        "p50_ms": percentile(seconds, 0.5) * 1000,
        "p99_ms": percentile(seconds, 0.99) * 1000,
        "commands_per_s": commands * len(seconds) / sum(seconds),
    }


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
        report |= await _write_cases(args.server, args)
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
    lines.append("")
    lines += _render_writes(report)
    if p is None:
        lines.append("psycopg is not installed: only asyncpg measured")
    return "\n".join(lines)


def _render_writes(report: dict[str, Any]) -> list[str]:
    single, batch = report["admission"], report["batch"]
    base = single["asyncpg, sequential awaits"]
    head = f"{'':<36}{'p50 ms':>8}{'p99 ms':>8}{'tx/s':>8}{'CPU ms/tx':>10}{'p50/asyncpg':>13}"
    lines = [
        "admission transaction (1 command, 6 statements), one after another:",
        head,
    ]
    for name, r in single.items():
        ratio = r["p50_ms"] / base["p50_ms"]
        lines.append(
            f"{name:<36}{r['p50_ms']:>8.2f}{r['p99_ms']:>8.2f}"
            f"{r['commands_per_s']:>8,.0f}{r['cpu_ms_per_tx']:>10.2f}{ratio:>13.2f}"
        )
    lite = single["store.append (sqlite)"]["p50_ms"]
    pg = single["store.append (postgres)"]["p50_ms"]
    lines += [
        "(CPU: this process's loop thread; SQLite's writer runs in a thread of its own)",
        f"store.append p50, PostgreSQL over SQLite: {pg / lite:.2f}",
    ]
    for name in ("psycopg pipeline, 3 syncs", "psycopg pipeline, 2 syncs (bound)"):
        if name in single:
            # The store's p50 moved by what the case's p50 differs from asyncpg's.
            delta = single[name]["p50_ms"] - base["p50_ms"]
            lines.append(f"  moved by {name}'s {delta:+.2f} ms: {(pg + delta) / lite:.2f}")
    base = batch["asyncpg, sequential awaits"]
    lines += [
        "",
        f"a batch of {_BATCH} admissions in one transaction (a statement per run of ops):",
        f"{'':<36}{'p50 ms':>8}{'p99 ms':>8}{'cmds/s':>8}{'CPU ms/tx':>10}{'cmds/s/asyncpg':>16}",
    ]
    for name, r in batch.items():
        ratio = r["commands_per_s"] / base["commands_per_s"]
        lines.append(
            f"{name:<36}{r['p50_ms']:>8.2f}{r['p99_ms']:>8.2f}"
            f"{r['commands_per_s']:>8,.0f}{r['cpu_ms_per_tx']:>10.2f}{ratio:>16.2f}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", default="postgresql://postgres@127.0.0.1:5432")
    parser.add_argument("-n", type=int, default=5000, help="round trips per measurement")
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument(
        "--admissions", type=int, default=1000, help="admission transactions per case"
    )
    parser.add_argument(
        "--batches", type=int, default=40, help=f"transactions of {_BATCH} commands per case"
    )
    parser.add_argument("--rounds", type=int, default=4, help="turns the write cases take")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    return report_main(lambda: _produce(args), _render, as_json=args.json, hard_limit_s=300)


if __name__ == "__main__":
    sys.exit(main())
