#!/usr/bin/env python3
"""Durable append throughput of the SQLite store, next to raw sqlite3 in the same run.

    .venv/bin/python scripts/bench_store.py                 # table, synchronous=FULL
    .venv/bin/python scripts/bench_store.py --json          # one JSON object on stdout
    .venv/bin/python scripts/bench_store.py --producers 1 100 --events 50000

Store runs (one per producer count, each on a fresh temp directory and database):

* ``--sessions`` sessions (default 100) are created first, one ``SessionCreated``
  command each; that phase is not timed.
* Then P producer tasks share one event counter: each takes the next index i and
  awaits ``store.append(Command.of(SessionRenamed(session_id=sessions[i % S], ...)))``
  (one event per command, the admission shape), round-robin over the sessions, until
  the run's event count is reached or its time budget (``--budget``) runs out.
  Only this append phase is timed; the store is opened before and closed after it.
* The average batch (commands per COMMIT) is counted by wrapping the store's private
  ``_writer.submit`` in this script; storage code is not modified.

Baselines (same process, same ``--synchronous``, fresh file each, WAL):

* raw executemany: the same number of rows as the store run committed, in the same
  ``event`` table (``storage.schema``) and row shape (position, id, aggregate_id, seq,
  type, created, data; ids from ``protocol.ids.event_id``, data from
  ``protocol.events.encode_data``), built beforehand; only
  ``BEGIN; executemany(INSERT ...); COMMIT`` is timed.
* raw executemany + projections, the like-for-like figure: the same event rows
  and the projection writes the store makes for them (the statements
  ``storage.projectors.project`` gives: one ``UPDATE session`` per rename),
  grouped by statement text into one ``executemany`` each, all in one
  transaction, on a database whose ``session`` rows were made beforehand
  (untimed) the store's way. Target: the store at 0.5x of it or better, with
  the events-only ratio printed beside it.
* raw, one transaction per row: ``BEGIN; INSERT; COMMIT`` per row (one fsync each at
  FULL), the reference for the 1-producer case: the best a single producer awaiting
  each append can hope for. It runs right after the 1-producer store run on the same
  rows (or at the end, with ``--events-1`` rows, when 1 is not among ``--producers``).

"ratio raw/store" is raw executemany events/s divided by store events/s: how many
times slower the store is; "store/raw+proj" and "store/raw events" are the store's
fraction of each baseline. The targets printed at the end (>= 20,000 events/s,
ratio <= 3, and store >= 0.5x raw executemany + projections) are judged on the
100-producer row; they are informational, and the exit
status is 0 unless the benchmark itself fails. Numbers depend on the disk's fsync
latency, which on shared machines varies from run to run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sqlite3
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any, Final

import attrs
from _benchlib import report_main, target_lines

from protocol import events as ev
from protocol import ids
from protocol.events import encode_data, stored_type
from protocol.shapes import Location
from storage._writer import migrate
from storage.projectors import project
from storage.reads import record_from_row
from storage.recorder import Command, RecordedEvent, now_ms
from storage.sqlite import SQLiteStore

_INSERT_EVENT: Final = (
    "INSERT INTO event (position, id, aggregate_id, seq, type, created, data)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
)
TARGET_EVENTS_PER_S: Final = 20_000
TARGET_PRODUCERS: Final = 100
TARGET_RATIO: Final = 3.0
#: The store's appends/s over raw executemany of the same rows plus their projection writes.
TARGET_OVER_PROJECTED: Final = 0.5

Row = tuple[int, str, str, int, str, int, str]


@attrs.frozen
class StoreRun:
    producers: int
    events: int
    seconds: float
    batches: int
    max_batch: int
    #: COMMITs that carried a single command.
    single_batches: int
    budget_hit: bool

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0

    @property
    def avg_batch(self) -> float:
        return self.events / self.batches if self.batches else 0.0


@attrs.frozen
class RawRun:
    events: int
    seconds: float

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0


def _log(args: argparse.Namespace, message: str) -> None:
    if not args.quiet:
        print(f"[bench_store] {message}", file=sys.stderr, flush=True)


# -- store --------------------------------------------------------------------------------------


async def store_run(
    directory: str,
    *,
    producers: int,
    events: int,
    sessions: int,
    synchronous: Any,
    budget: float,
) -> StoreRun:
    path = os.path.join(directory, "store.db")
    async with SQLiteStore(path, synchronous=synchronous) as store:
        session_ids = [ids.session_id() for _ in range(sessions)]
        location = Location(directory=directory)
        await asyncio.gather(
            *(
                store.append(
                    Command.of(ev.SessionCreated(session_id=s, title="bench", location=location))
                )
                for s in session_ids
            )
        )

        # Count commands per COMMIT: every batch the store hands its writer is one
        # BEGIN IMMEDIATE ... COMMIT. Installed after the untimed setup.
        writer = store._writer
        assert writer is not None
        sizes: list[int] = []
        submit = writer.submit

        def counting_submit(batch: list[Command]) -> None:
            sizes.append(len(batch))
            submit(batch)

        writer.submit = counting_submit  # type: ignore[method-assign]

        taken = 0
        budget_hit = False
        deadline = time.perf_counter() + budget

        async def producer() -> None:
            nonlocal taken, budget_hit
            while taken < events:
                if time.perf_counter() >= deadline:
                    budget_hit = True
                    return
                i = taken
                taken += 1
                title = f"title {i}"
                sid = session_ids[i % sessions]
                await store.append(Command.of(ev.SessionRenamed(session_id=sid, title=title)))

        start = time.perf_counter()
        await asyncio.wait_for(
            asyncio.gather(*(producer() for _ in range(producers))), timeout=budget + 60
        )
        seconds = time.perf_counter() - start
        writer.submit = submit  # type: ignore[method-assign]

        rows = await store.fetch("SELECT count(*) FROM event")
        stored = int(rows[0][0]) - sessions
        if stored != taken:
            raise RuntimeError(f"store holds {stored} appended events, producers sent {taken}")
    return StoreRun(
        producers=producers,
        events=taken,
        seconds=seconds,
        batches=len(sizes),
        max_batch=max(sizes, default=0),
        single_batches=sizes.count(1),
        budget_hit=budget_hit,
    )


# -- raw sqlite3 --------------------------------------------------------------------------------


def build_rows(events: int, session_ids: Sequence[str]) -> list[Row]:
    """``events`` SessionRenamed rows shaped as the store writes them, round-robin over sessions.

    Positions and seqs continue after one SessionCreated per session, as in the store run.
    """
    sessions = len(session_ids)
    seqs = [1] * sessions
    type_ = stored_type(ev.SessionRenamed)
    rows: list[Row] = []
    for i in range(events):
        k = i % sessions
        seqs[k] += 1
        event = ev.SessionRenamed(session_id=session_ids[k], title=f"title {i}")
        rows.append(
            (
                sessions + i + 1,
                ids.event_id(),
                session_ids[k],
                seqs[k],
                type_,
                now_ms(),
                encode_data(event).decode(),
            )
        )
    return rows


def _raw_connect(path: str, synchronous: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    migrate(conn)
    return conn


def raw_executemany(directory: str, rows: Sequence[Row], *, synchronous: str) -> RawRun:
    conn = _raw_connect(os.path.join(directory, "raw.db"), synchronous)
    try:
        start = time.perf_counter()
        conn.execute("BEGIN")
        conn.executemany(_INSERT_EVENT, rows)
        conn.execute("COMMIT")
        seconds = time.perf_counter() - start
    finally:
        conn.close()
    return RawRun(events=len(rows), seconds=seconds)


def created_rows(directory: str, session_ids: Sequence[str]) -> list[Row]:
    """One SessionCreated row per session, positions and seqs 1..: what precedes ``build_rows``."""
    type_ = stored_type(ev.SessionCreated)
    location = Location(directory=directory)
    return [
        (
            i + 1,
            ids.event_id(),
            sid,
            1,
            type_,
            now_ms(),
            encode_data(
                ev.SessionCreated(session_id=sid, title="bench", location=location)
            ).decode(),
        )
        for i, sid in enumerate(session_ids)
    ]


def projection_ops(rows: Sequence[Row]) -> dict[str, list[tuple[Any, ...]]]:
    """The store's projection statements for ``rows``, grouped by statement text (executemany)."""
    grouped: dict[str, list[tuple[Any, ...]]] = {}
    for row in rows:
        record: RecordedEvent = record_from_row(row)
        for op in project(record):
            grouped.setdefault(op.sql, []).append(tuple(op.params))
    return grouped


def raw_projected(
    directory: str, created: Sequence[Row], rows: Sequence[Row], *, synchronous: str
) -> RawRun:
    """``rows`` and their projection writes in one transaction, on a database that holds
    ``created`` (the sessions, made untimed the same way)."""
    conn = _raw_connect(os.path.join(directory, "raw_projected.db"), synchronous)
    try:
        conn.execute("BEGIN")
        conn.executemany(_INSERT_EVENT, created)
        for sql, params in projection_ops(created).items():
            conn.executemany(sql, params)
        conn.execute("COMMIT")
        ops = projection_ops(rows)
        start = time.perf_counter()
        conn.execute("BEGIN")
        conn.executemany(_INSERT_EVENT, rows)
        for sql, params in ops.items():
            conn.executemany(sql, params)
        conn.execute("COMMIT")
        seconds = time.perf_counter() - start
        updated = conn.execute("SELECT count(*) FROM session WHERE title <> 'bench'").fetchone()
        if rows and int(updated[0]) != min(len(rows), len(created)):
            raise RuntimeError(f"raw projections renamed {updated[0]} sessions")
    finally:
        conn.close()
    return RawRun(events=len(rows), seconds=seconds)


def raw_per_row(directory: str, rows: Sequence[Row], *, synchronous: str, budget: float) -> RawRun:
    conn = _raw_connect(os.path.join(directory, "raw_per_row.db"), synchronous)
    done = 0
    try:
        start = time.perf_counter()
        deadline = start + budget
        for row in rows:
            conn.execute("BEGIN")
            conn.execute(_INSERT_EVENT, row)
            conn.execute("COMMIT")
            done += 1
            if time.perf_counter() >= deadline:
                break
        seconds = time.perf_counter() - start
    finally:
        conn.close()
    return RawRun(events=done, seconds=seconds)


# -- driver -------------------------------------------------------------------------------------


def _events_for(args: argparse.Namespace, producers: int) -> int:
    return int(args.events_1 if producers == 1 else args.events)


def run(args: argparse.Namespace) -> dict[str, Any]:
    rows_out: list[dict[str, Any]] = []
    per_row: RawRun | None = None
    for producers in args.producers:
        events = _events_for(args, producers)
        with tempfile.TemporaryDirectory(prefix="bench_store-", dir=args.dir) as directory:
            _log(args, f"store: {producers} producers, up to {events} events ...")
            result = asyncio.run(
                store_run(
                    directory,
                    producers=producers,
                    events=events,
                    sessions=args.sessions,
                    synchronous=args.synchronous,
                    budget=args.budget,
                )
            )
            session_ids = [ids.session_id() for _ in range(args.sessions)]
            rows = build_rows(result.events, session_ids)
            raw = raw_executemany(directory, rows, synchronous=args.synchronous)
            projected = raw_projected(
                directory,
                created_rows(directory, session_ids),
                rows,
                synchronous=args.synchronous,
            )
            if producers == 1 and per_row is None:
                # Right after the 1-producer run, so both see the same disk weather.
                _log(args, f"raw, one transaction per row: up to {len(rows)} rows ...")
                per_row = raw_per_row(
                    directory, rows, synchronous=args.synchronous, budget=args.budget
                )
        ratio = raw.events_per_s / result.events_per_s if result.events_per_s else None
        _log(
            args,
            f"  {result.events} events in {result.seconds:.3f} s = "
            f"{result.events_per_s:,.0f}/s; raw {raw.events_per_s:,.0f}/s, "
            f"raw + projections {projected.events_per_s:,.0f}/s",
        )
        rows_out.append(
            {
                "producers": producers,
                "events": result.events,
                "seconds": round(result.seconds, 4),
                "events_per_s": round(result.events_per_s, 1),
                "raw_executemany_seconds": round(raw.seconds, 4),
                "raw_executemany_events_per_s": round(raw.events_per_s, 1),
                "ratio_raw_over_store": None if ratio is None else round(ratio, 2),
                "raw_projected_seconds": round(projected.seconds, 4),
                "raw_projected_events_per_s": round(projected.events_per_s, 1),
                "store_over_raw_projected": round(result.events_per_s / projected.events_per_s, 3),
                "store_over_raw_events": round(result.events_per_s / raw.events_per_s, 3),
                "batches": result.batches,
                "avg_batch": round(result.avg_batch, 2),
                "max_batch": result.max_batch,
                "single_command_batches": result.single_batches,
                "budget_hit": result.budget_hit,
            }
        )

    if per_row is None:
        with tempfile.TemporaryDirectory(prefix="bench_store-", dir=args.dir) as directory:
            _log(args, f"raw, one transaction per row: up to {args.events_1} rows ...")
            per_row = raw_per_row(
                directory,
                build_rows(args.events_1, [ids.session_id() for _ in range(args.sessions)]),
                synchronous=args.synchronous,
                budget=args.budget,
            )

    at_target = next((r for r in rows_out if r["producers"] == TARGET_PRODUCERS), None)
    targets = [
        {
            "name": f">= {TARGET_EVENTS_PER_S:,} events/s with {TARGET_PRODUCERS} producers",
            "value": None if at_target is None else at_target["events_per_s"],
            "unit": "events/s",
            "pass": None if at_target is None else at_target["events_per_s"] >= TARGET_EVENTS_PER_S,
        },
        {
            "name": f"store within {TARGET_RATIO:g}x of raw insert "
            f"(raw executemany, {TARGET_PRODUCERS} producers)",
            "value": None if at_target is None else at_target["ratio_raw_over_store"],
            "unit": "x slower than raw",
            "pass": None
            if at_target is None or at_target["ratio_raw_over_store"] is None
            else at_target["ratio_raw_over_store"] <= TARGET_RATIO,
        },
        {
            "name": f"store >= {TARGET_OVER_PROJECTED:g}x raw executemany of the same rows"
            f" + their projection writes, one transaction ({TARGET_PRODUCERS} producers)",
            "value": None if at_target is None else at_target["store_over_raw_projected"],
            "unit": "x raw + projections",
            "pass": None
            if at_target is None
            else at_target["store_over_raw_projected"] >= TARGET_OVER_PROJECTED,
        },
    ]
    return {
        "benchmark": "store_append",
        "synchronous": args.synchronous,
        "sessions": args.sessions,
        "budget_s": args.budget,
        "sqlite_version": sqlite3.sqlite_version,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "rows": rows_out,
        "raw_per_row_txn": {
            "events": per_row.events,
            "seconds": round(per_row.seconds, 4),
            "events_per_s": round(per_row.events_per_s, 1),
        },
        "targets": targets,
    }


def render(report: dict[str, Any]) -> str:
    headers = (
        "producers",
        "events",
        "seconds",
        "events/s",
        "raw executemany events/s",
        "raw + projections events/s",
        "store/raw+proj",
        "store/raw events",
        "ratio raw/store",
        "avg batch",
    )
    table = [
        (
            f"{r['producers']:,}",
            f"{r['events']:,}" + ("*" if r["budget_hit"] else ""),
            f"{r['seconds']:.3f}",
            f"{r['events_per_s']:,.0f}",
            f"{r['raw_executemany_events_per_s']:,.0f}",
            f"{r['raw_projected_events_per_s']:,.0f}",
            f"{r['store_over_raw_projected']:.2f}x",
            f"{r['store_over_raw_events']:.2f}x",
            "-" if r["ratio_raw_over_store"] is None else f"{r['ratio_raw_over_store']:.1f}x",
            f"{r['avg_batch']:.1f}",
        )
        for r in report["rows"]
    ]
    widths = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(headers)]
    lines = [
        f"sessionrt store append benchmark: synchronous={report['synchronous']}, "
        f"{report['sessions']} sessions (round-robin), one event per command, "
        f"SQLite {report['sqlite_version']}, Python {report['python']}, "
        f"{report['cpus']} CPUs",
        "",
        " | ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True)),
        "-+-".join("-" * w for w in widths),
    ]
    lines += [" | ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in table]
    for r in report["rows"]:
        if r["producers"] > 1 and r["batches"]:
            lines.append(
                f"  {r['producers']:,} producers: {r['batches']:,} COMMITs, "
                f"largest {r['max_batch']:,} commands, "
                f"{r['single_command_batches'] / r['batches']:.0%} carried a single command"
            )
    if any(r["budget_hit"] for r in report["rows"]):
        lines.append(f"* stopped by the time budget ({report['budget_s']:g} s)")
    per_row = report["raw_per_row_txn"]
    lines.append("")
    lines.append(
        f"raw, one transaction per row ({report['synchronous']}): {per_row['events']:,} rows "
        f"in {per_row['seconds']:.3f} s = {per_row['events_per_s']:,.0f} events/s"
    )
    single = next((r for r in report["rows"] if r["producers"] == 1), None)
    if single is not None and per_row["events_per_s"] and single["events_per_s"]:
        lines.append(
            f"  store with 1 producer: {single['events_per_s']:,.0f} events/s = "
            f"{single['events_per_s'] / per_row['events_per_s']:.2f}x that floor"
        )
    lines.append("")
    lines += target_lines(
        report["targets"],
        lambda value, unit: "n/a" if value is None else f"{value:,.1f} {unit}",
        heading="targets (informational):",
    )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--events",
        type=int,
        default=50_000,
        help="events per store run with more than one producer (default: %(default)s)",
    )
    parser.add_argument(
        "--events-1",
        type=int,
        default=5_000,
        help="events for the 1-producer run; the one-transaction-per-row baseline writes"
        " as many rows as that run committed (each is one fsync at FULL; default: %(default)s)",
    )
    parser.add_argument(
        "--producers",
        type=int,
        nargs="+",
        default=[1, 10, 100, 1000],
        help="concurrent producer counts, one run each (default: 1 10 100 1000)",
    )
    parser.add_argument(
        "--synchronous",
        choices=("FULL", "NORMAL"),
        type=str.upper,
        default="FULL",
        help="PRAGMA synchronous for the store and the raw baselines (default: %(default)s)",
    )
    parser.add_argument(
        "--sessions", type=int, default=100, help="sessions per run (default: %(default)s)"
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=10.0,
        help="time cap in seconds per timed phase; a run stops early past it"
        " (default: %(default)s)",
    )
    parser.add_argument(
        "--dir", default=None, help="where temp databases go (default: the system temp dir)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)
    if args.events < 1 or args.events_1 < 1 or args.sessions < 1 or args.budget <= 0:
        parser.error("--events, --events-1, --sessions and --budget must be positive")
    if any(p < 1 for p in args.producers):
        parser.error("--producers must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return report_main(
        lambda: run(args),
        render,
        as_json=args.json,
        hard_limit_s=(len(args.producers) + 1) * (args.budget + 90) + 60,
    )


if __name__ == "__main__":
    sys.exit(main())
