#!/usr/bin/env python3
"""The PostgreSQL backend's figures (issue #15 §5), each next to a baseline from the same run.

    .venv/bin/python scripts/bench_postgres.py               # table
    .venv/bin/python scripts/bench_postgres.py --json        # one JSON object on stdout
    .venv/bin/python scripts/bench_postgres.py --server postgresql://postgres@127.0.0.1:5432

Every phase creates its own uniquely named database on ``--server`` and drops it
(``WITH (FORCE)``) afterwards.

1. **Appends.** ``storage.connect(url)`` (the ``PostgresStore``); ``--producers``
   tasks each append ``--appends`` one-event commands (``SessionRenamed`` on its own
   session, awaited one after another): durable events/s over the wall time.
   Baselines, on the very rows each round committed, in the same database:
   raw asyncpg ``executemany`` of the rows and of their projection writes
   (``storage.projectors.project``: one ``UPDATE session`` per rename, on a
   fresh copy of the session table, ``raw_ctx.session``) in one transaction
   on one connection, the like-for-like figure (target: the store at 0.7x of
   it or better); and ``executemany`` of the event rows alone, printed beside
   it. The store and the baselines take turns, ``--append-rounds`` times;
   each one's time is summed over its rounds (a machine whose speed drifts
   slows all alike). ``--append-warmup`` rounds (1) go first and are not
   counted; the store is opened for each round, its first appends uncounted.
   Shown too: a batch's events inserted 50 per statement by ``executemany``,
   by ``INSERT … SELECT FROM unnest`` (the store's form) and by
   ``copy_records_to_table``, on each round's rows; the same rows from as
   many tasks, one INSERT (one commit) each, on a pool of 10 connections;
   CPU per event on each side (this process's loop thread,
   ``time.thread_time``; every ``postgres`` process of the local server,
   from ``/proc``).
2. **Admission over HTTP.** The real app (``server.app.make_app``) on a loopback
   ``TCPSite`` with ``[runtime] database`` the PostgreSQL URL, and one on a
   SQLite data dir (``synchronous=FULL``), both up at once; after a warm-up
   of each, ``--admission-rounds`` turns of sequential
   ``POST /api/session/{id}/prompt`` (``resume: false``, ``--requests`` in all
   per backend), the two in a new order each turn, client on the same event
   loop (client cost is in the figure). Target: PostgreSQL's p50 at most
   1.5x SQLite's.
3. **Commit on host A -> SSE frame on host B.** Two apps (host ids ``bench-a`` and
   ``bench-b``) on one database, in this process. A follower reads
   ``GET /api/experimental/session/{id}/log?follow=true`` from B; prompts go to A.
   The commit is timestamped by a subscriber on A's store (the moment A's log
   learns of its commit); the frame when its chunk reaches the client. B learns of
   the commit only through PostgreSQL (LISTEN/NOTIFY). Baseline: a follower on A
   itself, same prompts. Target: p50 <= 5 ms.
4. **Failover.** Two ``sessionrt serve`` subprocesses on one database with
   ``lease_ttl_ms = --lease-ttl-ms`` (2000 by default). A session runs a slow
   bash call on host A (so A holds its execution lease); a follower reads its
   log from host B; A is SIGKILLed; timed: kill -> the first new frame on B.
   Target: <= lease ttl + 1 s. Why 2000 ms is a sane ttl here: hosts renew
   well inside it on loopback, and a shorter ttl only shortens the wait a dead
   host's sessions pay; the figure is meant as "expiry + takeover", so the
   ttl is the baseline it is read against. ``--failovers`` runs, median reported.
5. **Runtime steps.** ``--step-sessions`` sessions (100) on one in-process
   runtime with its log on PostgreSQL, each given ``--step-rounds`` prompts (10)
   one after another, all sessions at once (``prompt(resume=False)`` then
   ``execution.resume``, as ``bench_runtime`` phase 2); steps/s, and how many
   of the store's batches took each of its paths. Baseline: the same on a
   SQLite data dir. No target: context for the multi-host runtime's cost.

The machine's load (other processes) moves every figure; compare rows of one
run (the load average is printed with them).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final

import aiohttp
import orjson
from _benchlib import percentile, report_main, target_lines
from aiohttp import web

from actors.runtime import Runtime, RuntimeConfig
from protocol import Location
from protocol import events as ev
from protocol.requests import PromptInput
from server.app import RUNTIME, ServerSettings, make_app
from storage import Command, RecordedEvent, connect
from storage.postgres import writer as writer_sql
from storage.postgres.dialect import translate
from storage.projectors import project
from storage.reads import record_from_row

#: The store's appends/s over raw executemany of the same rows plus their projection writes.
TARGET_STORE_OVER_PROJECTED: Final = 0.7
#: Admission p50 on PostgreSQL over SQLite's, same run.
TARGET_ADMIT_OVER_SQLITE: Final = 1.5
TARGET_CROSS_HOST_P50_MS: Final = 5.0
JSON_HEADERS: Final = {"Content-Type": "application/json"}
FRAME_TIMEOUT_S: Final = 10.0
#: Connections of the raw one-commit-per-row baseline's pool (asyncpg's default max).
RAW_POOL: Final = 10

clock = time.perf_counter_ns

_RAW_TABLE = (
    "CREATE TABLE raw_event (position BIGSERIAL PRIMARY KEY, id TEXT NOT NULL UNIQUE,"
    " aggregate_id TEXT NOT NULL, seq BIGINT NOT NULL, type TEXT NOT NULL,"
    " created BIGINT NOT NULL, data TEXT NOT NULL, UNIQUE (aggregate_id, seq))"
)
_RAW_INSERT = (
    "INSERT INTO raw_event (id, aggregate_id, seq, type, created, data)"
    " VALUES ($1, $2, $3, $4, $5, $6)"
)


def _server_cpu_s() -> float | None:
    """CPU seconds (user + system) of every ``postgres`` process on this machine so far.

    Context for the appends: the server is local in these runs, and its backends,
    WAL writer and listeners all count. None where ``/proc`` says nothing of it.
    """
    total, found = 0, False
    for pid in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() != "postgres":
                    continue
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile, or not ours to read
        total += int(fields[11]) + int(fields[12])
        found = True
    return total / os.sysconf("SC_CLK_TCK") if found else None


class _Span:
    """Wall seconds, this thread's CPU and the server's CPU over the spans it
    measures, summed. The ``/proc`` scans fall outside the timed span: on the
    baseline's short rounds they would otherwise be a visible share of its time.
    """

    def __init__(self) -> None:
        self.seconds = 0.0
        self.client = 0.0
        self.server: float | None = 0.0

    @contextlib.contextmanager
    def measure(self, counted: bool = True) -> Iterator[None]:
        if not counted:
            yield
            return
        server = _server_cpu_s()
        client = time.thread_time()
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds += time.perf_counter() - started
            self.client += time.thread_time() - client
            after = _server_cpu_s()
            if server is None or after is None or self.server is None:
                self.server = None
            else:
                self.server += after - server

    def per_event_us(self, events: int) -> dict[str, float | None]:
        return {
            "client_cpu_us_per_event": round(self.client / events * 1e6, 2),
            "server_cpu_us_per_event": (
                None if self.server is None else round(self.server / events * 1e6, 2)
            ),
        }


def _log(args: argparse.Namespace, message: str) -> None:
    if not args.quiet:
        print(f"[bench_postgres] {message}", file=sys.stderr, flush=True)


def _ms(ns: Sequence[int]) -> dict[str, float]:
    ms = [v / 1e6 for v in ns]
    return {
        "count": len(ms),
        "p50_ms": round(percentile(ms, 0.5), 3),
        "p99_ms": round(percentile(ms, 0.99), 3),
        "max_ms": round(max(ms, default=0.0), 3),
    }


@contextlib.asynccontextmanager
async def database(server: str) -> AsyncIterator[str]:
    """A fresh, uniquely named database on ``server``, dropped afterwards."""
    import asyncpg

    name = f"sessionrt_bench_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(f"{server}/postgres")
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    try:
        yield f"{server}/{name}"
    finally:
        admin = await asyncpg.connect(f"{server}/postgres")
        try:
            await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        finally:
            await admin.close()


# -- 1. appends ---------------------------------------------------------------------------------


async def bench_appends(args: argparse.Namespace) -> dict[str, Any]:
    import asyncpg

    producers, per, rounds = args.producers, args.appends, args.append_rounds
    warmups = args.append_warmup
    store_spans: dict[str, _Span] = {}
    raw_span = _Span()
    raw_s = raw_projected_s = 0.0
    forms_s = dict.fromkeys(EVENT_FORMS, 0.0)
    commits = chained = 0
    async with database(args.server) as url:
        conn = await asyncpg.connect(url)
        # The projected context writes a copy of the session table (see
        # _context_sessions): its thousands of updates in one transaction
        # must not leave the store's own table bloated for the next round.
        context = await asyncpg.connect(url, server_settings={"search_path": "raw_ctx, public"})
        forms = await asyncpg.connect(url, server_settings={"search_path": "forms, public"})
        opens = _sides(url)
        store_spans = {side: _Span() for side in opens}
        sessions = [f"ses_bench{i:05d}" for i in range(producers)]
        try:
            settings = {
                name: await conn.fetchval(f"SHOW {name}")
                for name in ("synchronous_commit", "fsync", "server_version")
            }
            await conn.execute(_RAW_TABLE)
            async with opens["plain"]() as store:
                loc = Location(directory="/")
                await asyncio.gather(
                    *(
                        store.append(
                            Command.of(ev.SessionCreated(session_id=s, title="t", location=loc))
                        )
                        for s in sessions
                    )
                )
            await conn.execute(_FORMS_SCHEMA)  # copies of the tables the store made
            for n in range(warmups + rounds):
                # Each side's round, then the baselines on the very rows it
                # committed: they take turns (the sides in a new order each
                # round), so a machine whose speed drifts slows all alike.
                # The first rounds warm every side up (the raw side prepares
                # its insert) and are not counted; each side's store is
                # opened for its round, and its first appends (its
                # connections learning their statements) are not counted.
                timed = n >= warmups
                sides = list(opens) if n % 2 == 0 else list(opens)[::-1]
                for side in sides:
                    async with opens[side]() as store:

                        async def producer(session_id: str, k0: int, k1: int, tag: str) -> None:
                            for k in range(k0, k1):
                                title = f"renamed {tag}.{k}"
                                event = ev.SessionRenamed(session_id=session_id, title=title)
                                await store.append(Command.of(event))

                        tag = f"{n}{side}"
                        await asyncio.gather(*(producer(s, -2, 0, tag) for s in sessions))
                        after = await conn.fetchval("SELECT coalesce(max(position), 0) FROM event")
                        batches_before = sum(store.batch_paths.values())
                        chains_before = store.chains["taken"]
                        with store_spans[side].measure(timed):
                            await asyncio.gather(*(producer(s, 0, per, tag) for s in sessions))
                        if timed and side == "plain":
                            commits += sum(store.batch_paths.values()) - batches_before
                            chained += store.chains["taken"] - chains_before
                    stored = await _same_rows(conn, producers * per, after)
                    await conn.execute("TRUNCATE raw_event")
                    started = time.perf_counter()
                    with raw_span.measure(timed):
                        async with conn.transaction():
                            await conn.executemany(_RAW_INSERT, stored)
                    if timed:
                        raw_s += time.perf_counter() - started
                    await conn.execute("TRUNCATE raw_event")
                    # The like-for-like baseline: the same rows plus the
                    # projection writes the store made for them (the
                    # statements ``project`` gives), still one transaction.
                    ops = _projection_ops(stored)
                    await _context_sessions(conn)
                    started = time.perf_counter()
                    async with context.transaction():
                        await context.executemany(_RAW_INSERT, stored)
                        for sql, params in ops.items():
                            await context.executemany(sql, params)
                    if timed:
                        raw_projected_s += time.perf_counter() - started
                    for form, seconds in (await _event_forms(conn, forms, stored, n)).items():
                        if timed:
                            forms_s[form] += seconds
            await conn.execute("TRUNCATE raw_event")
        finally:
            await forms.close()
            await context.close()
            await conn.close()
        per_row_s = await _raw_per_row(url, stored, producers)
    events = producers * per * rounds
    baselines = len(opens) * events  # each side's rows went through the baselines
    rates = {side: round(events / span.seconds, 1) for side, span in store_spans.items()}
    raw_rate = baselines / raw_s
    projected_rate = baselines / raw_projected_s
    plain = rates["plain"]
    return {
        "producers": producers,
        "events": events,
        "store_events_per_s": rates,
        "raw_executemany_events_per_s": round(raw_rate, 1),
        "raw_executemany_projected_events_per_s": round(projected_rate, 1),
        "store_over_raw_projected": round(plain / projected_rate, 2),
        "store_over_raw_events": round(plain / raw_rate, 2),
        "event_forms_events_per_s": {f: round(baselines / s, 1) for f, s in forms_s.items()},
        "event_form_chunk": EVENT_FORM_CHUNK,
        "rounds": rounds,
        "warmup_rounds": warmups,
        "raw_per_row_txn_events_per_s": round(producers * per / per_row_s, 1),
        "raw_per_row_pool": RAW_POOL,
        "store_transactions": commits,
        "store_transactions_begun_by_the_one_before": chained,
        "events_per_transaction": round(events / commits, 1) if commits > 0 else None,
        "server_settings": settings,
        "store_cpu": {side: span.per_event_us(events) for side, span in store_spans.items()},
        "raw_cpu": raw_span.per_event_us(baselines),
    }


#: The forms an insert of a batch's events can take, measured side by side:
#: with each event's position and seq given, and as the store needs them,
#: both found under the batch lock (the store's statement takes its block of
#: positions and computes each seq itself; executemany and COPY take no
#: expression, so a read of the heads and the block goes first).
EVENT_FORMS: Final = (
    "executemany",
    "unnest",
    "copy",
    "the store's statement",
    "read, then executemany",
    "read, then copy",
)
#: Events per statement in that measurement: what one of the store's batches
#: held with 100 producers on two writer lanes (one lane's hold all 100).
EVENT_FORM_CHUNK: Final = 50
_RAW_COLUMNS: Final = ("position", "id", "aggregate_id", "seq", "type", "created", "data")
_RAW_POSITIONED: Final = (
    "INSERT INTO raw_event (position, id, aggregate_id, seq, type, created, data)"
    " VALUES ($1, $2, $3, $4, $5, $6, $7)"
)
_RAW_UNNEST: Final = (
    "INSERT INTO raw_event (position, id, aggregate_id, seq, type, created, data)"
    " SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[], $5::text[],"
    " $6::bigint[], $7::text[])"
)
#: The store's tables, empty, in a schema of their own (``forms``).
_FORMS_SCHEMA: Final = (
    "DROP SCHEMA IF EXISTS forms CASCADE; CREATE SCHEMA forms;"
    " CREATE TABLE forms.event (LIKE public.event INCLUDING ALL);"
    " CREATE SEQUENCE forms.event_position"
)
_FORMS_READ: Final = (
    "SELECT setval('event_position', nextval('event_position') + $1 - 1),"
    " ARRAY(SELECT coalesce((SELECT max(seq) FROM event WHERE aggregate_id = a), 0)"
    " FROM unnest($2::text[]) AS a)"
)
_FORMS_POSITIONED: Final = _RAW_POSITIONED.replace("raw_event", "event")


async def _event_forms(
    conn: Any, forms: Any, rows: Sequence[tuple[Any, ...]], n: int
) -> dict[str, float]:
    """Seconds each form takes to insert ``rows`` :data:`EVENT_FORM_CHUNK` per
    statement, in one transaction, in a new order each round. ``forms`` is a
    connection whose search path finds the ``forms`` schema first."""
    positioned = [(i + 1, *row) for i, row in enumerate(rows)]
    chunks = [
        positioned[i : i + EVENT_FORM_CHUNK] for i in range(0, len(positioned), EVENT_FORM_CHUNK)
    ]
    order = EVENT_FORMS[n % len(EVENT_FORMS) :] + EVENT_FORMS[: n % len(EVENT_FORMS)]
    out: dict[str, float] = {}
    for form in order:
        await conn.execute("TRUNCATE raw_event, forms.event")
        started = time.perf_counter()
        target = forms if form in EVENT_FORMS[3:] else conn
        async with target.transaction():
            for chunk in chunks:
                await _insert_form(target, form, chunk)
        out[form] = time.perf_counter() - started
    await conn.execute("TRUNCATE raw_event, forms.event")
    return out


async def _insert_form(conn: Any, form: str, chunk: Sequence[tuple[Any, ...]]) -> None:
    if form == "executemany":
        await conn.executemany(_RAW_POSITIONED, chunk)
    elif form == "unnest":
        await conn.execute(_RAW_UNNEST, *map(list, zip(*chunk, strict=True)))
    elif form == "copy":
        await conn.copy_records_to_table("raw_event", records=chunk, columns=_RAW_COLUMNS)
    else:
        _, ids, aggs, _, types, created, data = map(list, zip(*chunk, strict=True))
        place = [0] * len(chunk)
        seen: dict[str, int] = {}
        for k, agg in enumerate(aggs):
            seen[agg] = place[k] = seen.get(agg, 0) + 1
        if form == "the store's statement":
            await conn.fetch(
                writer_sql.INSERT_EVENTS, len(chunk), ids, aggs, place, types, created, data, "b"
            )
            return
        last, heads = await conn.fetchrow(_FORMS_READ, len(chunk), aggs)
        rows = [
            (last - len(chunk) + 1 + k, ids[k], aggs[k], heads[k] + place[k], *row[4:])
            for k, row in enumerate(chunk)
        ]
        if form == "read, then executemany":
            await conn.executemany(_FORMS_POSITIONED, rows)
        else:
            await conn.copy_records_to_table("event", records=rows, columns=_RAW_COLUMNS)


def _sides(url: str) -> dict[str, Callable[[], Any]]:
    """Each write path measured, as a function opening a store on it. Issue 38
    measured the generated-function path (``_fast``) as a second side here in
    the same rounds, then deleted it (see the README)."""
    return {"plain": lambda: connect(url)}


async def _context_sessions(conn: Any) -> None:
    """``raw_ctx.session``: a fresh copy of the store's session table (its
    columns, indexes and rows), for the projected context to update."""
    await conn.execute(
        "DROP SCHEMA IF EXISTS raw_ctx CASCADE; CREATE SCHEMA raw_ctx;"
        " CREATE TABLE raw_ctx.session (LIKE public.session INCLUDING ALL)"
    )
    columns = ", ".join(
        await conn.fetchval(
            "SELECT array_agg(quote_ident(column_name::text) ORDER BY ordinal_position)"
            " FROM information_schema.columns WHERE table_schema = 'public'"
            " AND table_name = 'session' AND is_generated = 'NEVER'"
        )
    )
    await conn.execute(
        f"INSERT INTO raw_ctx.session ({columns}) SELECT {columns} FROM public.session"
    )


def _projection_ops(rows: Sequence[tuple[Any, ...]]) -> dict[str, list[tuple[Any, ...]]]:
    """The store's projection statements for ``rows``, grouped by statement (executemany)."""
    grouped: dict[str, list[tuple[Any, ...]]] = {}
    for row in rows:
        for op in project(record_from_row((0, *row))):
            grouped.setdefault(translate(op.sql), []).append(tuple(op.params))
    return grouped


async def _raw_per_row(url: str, rows: Sequence[tuple[Any, ...]], producers: int) -> float:
    """The same rows from ``producers`` tasks, one INSERT (one commit) each, on a pool."""
    import asyncpg

    pool = await asyncpg.create_pool(url, min_size=RAW_POOL, max_size=RAW_POOL)
    try:
        per = [rows[i::producers] for i in range(producers)]

        async def producer(mine: Sequence[tuple[Any, ...]]) -> None:
            for row in mine:
                async with pool.acquire() as conn:
                    await conn.execute(_RAW_INSERT, *row)

        started = time.perf_counter()
        await asyncio.gather(*(producer(m) for m in per))
        return time.perf_counter() - started
    finally:
        await pool.close()


async def _same_rows(conn: Any, count: int, after: int) -> list[tuple[Any, ...]]:
    """The rows the store committed after position ``after`` (a round's renames), as
    the raw baseline inserts them."""
    rows = await conn.fetch(
        "SELECT id, aggregate_id, seq, type, created, data FROM event"
        " WHERE type LIKE 'session.renamed%' AND position > $1 ORDER BY position",
        after,
    )
    if len(rows) != count:
        raise RuntimeError(f"the store committed {len(rows)} renames, expected {count}")
    return [tuple(r) for r in rows]


# -- HTTP helpers -------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def serving(
    data_dir: Path, database_url: str | None, host_id: str | None = None
) -> AsyncIterator[tuple[str, Any]]:
    workdir = data_dir.parent / "project"
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    await asyncio.to_thread(data_dir.mkdir, parents=True, exist_ok=True)
    config = RuntimeConfig(
        data_dir=data_dir,
        synchronous="FULL",
        default_directory=str(workdir),
        database=database_url,
        host_id=host_id,
    )
    app = make_app(config=config, settings=ServerSettings())
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=5)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}", app[RUNTIME]
    finally:
        await runner.cleanup()


async def _create(http: aiohttp.ClientSession, base: str) -> str:
    payload = orjson.dumps({"title": "bench"})
    async with http.post(base + "/api/session", data=payload, headers=JSON_HEADERS) as resp:
        body = await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"POST /api/session: {resp.status} {body[:200]!r}")
    return str(orjson.loads(body)["data"]["id"])


async def _prompt(
    http: aiohttp.ClientSession, base: str, session_id: str, text: str, *, resume: bool = False
) -> str:
    payload = orjson.dumps({"text": text, "resume": resume})
    url = f"{base}/api/session/{session_id}/prompt"
    async with http.post(url, data=payload, headers=JSON_HEADERS) as resp:
        body = await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"POST prompt: {resp.status} {body[:200]!r}")
    return str(orjson.loads(body)["data"]["id"])


Frame = tuple[int, int | None, bytes | None, bytes]


async def _frames(resp: aiohttp.ClientResponse, on_frame: Callable[[Frame], None]) -> None:
    """Split an SSE stream into frames: ``on_frame((t_ns, id, event, data))``."""
    buffer = b""
    async for chunk in resp.content.iter_any():
        t = clock()
        buffer += chunk
        if b"\n\n" not in buffer:
            continue
        *frames, buffer = buffer.split(b"\n\n")
        for raw in frames:
            fid: int | None = None
            event: bytes | None = None
            data: bytes | None = None
            for line in raw.split(b"\n"):
                if line.startswith(b"data: "):
                    data = line[6:]
                elif line.startswith(b"id: "):
                    fid = int(line[4:])
                elif line.startswith(b"event: "):
                    event = line[7:]
            if data is not None:
                on_frame((t, fid, event, data))


# -- 2. admission -------------------------------------------------------------------------------


async def _admission(
    http: aiohttp.ClientSession, base: str, sessions: Sequence[str], requests: int, first: int
) -> list[int]:
    out: list[int] = []
    for i in range(first, first + requests):
        t0 = clock()
        await _prompt(http, base, sessions[i % len(sessions)], f"bench prompt {i}")
        out.append(clock() - t0)
    return out


async def bench_admission(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Both servers up at once, taking turns: ``--admission-rounds`` rounds of
    sequential prompts to each (a new order each round), after a warm-up of each."""
    times: dict[str, list[int]] = {"postgres": [], "sqlite": []}
    rounds = args.admission_rounds
    async with (
        database(args.server) as url,
        serving(tmp / "pg-admit" / "data", url) as (pg_base, _),
        serving(tmp / "sqlite-admit" / "data", None) as (lite_base, _),
        aiohttp.ClientSession() as http,
    ):
        bases = {"postgres": pg_base, "sqlite": lite_base}
        sessions = {
            name: [await _create(http, base) for _ in range(10)] for name, base in bases.items()
        }
        for name, base in bases.items():
            await _admission(http, base, sessions[name], args.warmup, 0)
        per = -(-args.requests // rounds)
        for n in range(rounds):
            for name in ("postgres", "sqlite") if n % 2 == 0 else ("sqlite", "postgres"):
                times[name] += await _admission(
                    http, bases[name], sessions[name], per, args.warmup + n * per
                )
    return {name: _ms(ns) for name, ns in times.items()} | {"requests": per * rounds}


# -- 3. commit on A -> frame on B ---------------------------------------------------------------


async def _deliveries(
    http: aiohttp.ClientSession,
    prompt_base: str,
    follow_base: str,
    session_id: str,
    committed: dict[str, int],
    count: int,
) -> list[int]:
    loop = asyncio.get_running_loop()
    arrived: dict[str, int] = {}
    waiting: dict[str, asyncio.Future[int]] = {}
    synced: asyncio.Future[None] = loop.create_future()

    def on_frame(frame: Frame) -> None:
        t, _, event, data = frame
        if event == b"log.synced" and not synced.done():
            synced.set_result(None)
        elif event == b"session.inbox.enqueued":
            key = str(orjson.loads(data)["data"]["inboxID"])
            future = waiting.pop(key, None)
            if future is not None and not future.done():
                future.set_result(t)
            else:
                arrived[key] = t

    url = f"{follow_base}/api/experimental/session/{session_id}/log"
    out: list[int] = []
    async with http.get(url, params={"follow": "true"}) as resp:
        if resp.status != 200:
            raise RuntimeError(f"follow: {resp.status}")
        reader = asyncio.ensure_future(_frames(resp, on_frame))
        try:
            await asyncio.wait_for(synced, FRAME_TIMEOUT_S)
            for i in range(count + 20):
                inbox_id = await _prompt(http, prompt_base, session_id, f"delivery {i}")
                if inbox_id in arrived:
                    t_frame = arrived.pop(inbox_id)
                else:
                    future: asyncio.Future[int] = loop.create_future()
                    waiting[inbox_id] = future
                    t_frame = await asyncio.wait_for(future, FRAME_TIMEOUT_S)
                if i >= 20:  # the first 20 are a warm-up
                    out.append(t_frame - committed[inbox_id])
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
    return out


async def bench_cross_host(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    async with (
        database(args.server) as url,
        serving(tmp / "host-a" / "data", url, "bench-a") as (base_a, runtime_a),
        serving(tmp / "host-b" / "data", url, "bench-b") as (base_b, _),
    ):
        committed: dict[str, int] = {}

        def on_commit(records: Sequence[RecordedEvent]) -> None:
            now = clock()
            for record in records:
                if record.type.startswith("session.inbox.enqueued"):
                    committed[str(orjson.loads(record.data)["inboxID"])] = now

        unsubscribe = runtime_a.store.subscribe(on_commit)
        try:
            async with aiohttp.ClientSession() as http:
                session_id = await _create(http, base_a)
                other = await _create(http, base_a)
                cross = await _deliveries(
                    http, base_a, base_b, session_id, committed, args.deliveries
                )
                same = await _deliveries(http, base_a, base_a, other, committed, args.deliveries)
        finally:
            unsubscribe()
    return {"cross_host": _ms(cross), "same_host": _ms(same)}


# -- 4. failover --------------------------------------------------------------------------------


class Host:
    """One ``sessionrt serve`` subprocess on the shared database."""

    def __init__(self, root: Path, database_url: str, ttl_ms: int, name: str) -> None:
        data = root / name
        data.mkdir(parents=True, exist_ok=True)
        project = root / "project"
        project.mkdir(exist_ok=True)
        config = data / "config.toml"
        config.write_text(
            f'[runtime]\nhost_id = "{name}"\nlease_ttl_ms = {ttl_ms}\n'
            f'database = "{database_url}"\ndefault_directory = "{project}"\n'
        )
        env = {k: v for k, v in os.environ.items() if k != "SESSIONRT_SERVER_PASSWORD"}
        exe = Path(sys.executable).parent / "sessionrt"
        self.log = (root / f"{name}.log").open("ab")
        self.proc = subprocess.Popen(
            [str(exe), "serve", "--port", "0", "--data-dir", str(data), "--config", str(config)],
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self.log,
        )

    async def listening(self) -> str:
        assert self.proc.stdout is not None
        stdout = self.proc.stdout

        def first_line() -> str:
            for raw in stdout:
                line = raw.decode(errors="replace").strip()
                if " listening on " in line:
                    return line.rsplit(" ", 1)[-1]
            raise RuntimeError("a host exited before listening (see its log)")

        url = await asyncio.wait_for(asyncio.to_thread(first_line), 60)
        threading.Thread(target=lambda: [None for _ in stdout], daemon=True).start()
        return url

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.log.close()


async def _one_failover(
    args: argparse.Namespace, root: Path, url: str, n: int
) -> tuple[float, str]:
    a = Host(root, url, args.lease_ttl_ms, f"fail-a{n}")
    b = Host(root, url, args.lease_ttl_ms, f"fail-b{n}")
    try:
        base_a, base_b = await asyncio.gather(a.listening(), b.listening())
        loop = asyncio.get_running_loop()
        seen: list[tuple[int, int]] = []
        after_kill: asyncio.Future[tuple[int, str]] = loop.create_future()
        running: asyncio.Future[None] = loop.create_future()
        killed_at: list[int] = []

        def on_frame(frame: Frame) -> None:
            t, fid, event, _ = frame
            if fid is None:
                return
            seen.append((t, fid))
            if event is not None and b"tool" in event and not running.done():
                running.set_result(None)
            if killed_at and not after_kill.done():
                after_kill.set_result((t, (event or b"?").decode()))

        async with aiohttp.ClientSession() as http:
            session_id = await _create(http, base_a)
            url_b = f"{base_b}/api/experimental/session/{session_id}/log"
            timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
            async with http.get(url_b, params={"follow": "true"}, timeout=timeout) as resp:
                reader = asyncio.ensure_future(_frames(resp, on_frame))
                try:
                    command = orjson.dumps({"command": "sleep 60"}).decode()
                    await _prompt(http, base_a, session_id, f"#tool bash {command}", resume=True)
                    await asyncio.wait_for(running, FRAME_TIMEOUT_S)
                    await asyncio.sleep(0.3)  # the last frames of the start reach B
                    killed_at.append(clock())
                    a.kill()
                    limit = args.lease_ttl_ms / 1000 + 30
                    t_next, next_type = await asyncio.wait_for(after_kill, limit)
                finally:
                    reader.cancel()
                    await asyncio.gather(reader, return_exceptions=True)
        return (t_next - killed_at[0]) / 1e9, next_type
    finally:
        a.kill()
        b.kill()


async def bench_failover(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    runs: list[float] = []
    next_types: list[str] = []
    for n in range(args.failovers):
        async with database(args.server) as url:
            seconds, next_type = await _one_failover(args, tmp, url, n)
        runs.append(seconds)
        next_types.append(next_type)
    return {
        "lease_ttl_ms": args.lease_ttl_ms,
        "next_event_types": next_types,
        "runs_s": [round(r, 3) for r in runs],
        "median_s": round(statistics.median(runs), 3),
    }


# -- report -------------------------------------------------------------------------------------


# -- 5. steps ------------------------------------------------------------------------------------


async def _steps_on(
    tmp: Path, database_url: str | None, sessions: int, rounds: int
) -> dict[str, Any]:
    base = tmp / ("steps-postgres" if database_url else "steps-sqlite")
    (base / "project").mkdir(parents=True)
    config = RuntimeConfig(
        data_dir=base / "data", default_directory=str(base / "project"), database=database_url
    )
    async with Runtime(config) as rt:
        sids = [(await rt.sessions.create()).id for _ in range(sessions)]

        async def step(sid: str, text: str) -> None:
            await rt.sessions.prompt(sid, PromptInput(text=text, resume=False))
            terminal = await rt.execution.resume(sid)
            if terminal.kind != "succeeded":
                raise RuntimeError(f"a step ended {terminal}")

        for sid in sids[:5]:
            await step(sid, "warm-up")
        paths_before = dict(getattr(rt.store, "batch_paths", {}))

        async def drive(sid: str) -> None:
            for i in range(rounds):
                await step(sid, f"prompt {i}")

        started = time.perf_counter()
        await asyncio.gather(*(drive(sid) for sid in sids))
        seconds = time.perf_counter() - started
        paths = {
            k: v - paths_before.get(k, 0) for k, v in getattr(rt.store, "batch_paths", {}).items()
        }
    return {"steps_per_s": round(sessions * rounds / seconds, 1), "batch_paths": paths}


async def bench_steps(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """The runtime's steps/s, ``--step-sessions`` sessions x ``--step-rounds`` prompts
    each (one after another, all sessions at once), on PostgreSQL and on SQLite."""
    n, rounds = args.step_sessions, args.step_rounds
    async with database(args.server) as url:
        postgres = await _steps_on(tmp, url, n, rounds)
    sqlite = await _steps_on(tmp, None, n, rounds)
    return {"sessions": n, "rounds": rounds, "postgres": postgres, "sqlite": sqlite}


def _figure(
    name: str,
    value: float,
    unit: str,
    baseline: float | None,
    label: str,
    target: str | None = None,
    passed: bool | None = None,
) -> dict[str, Any]:
    ratio = None if not baseline else round(value / baseline, 2)
    return {
        "name": name,
        "value": value,
        "unit": unit,
        "baseline": baseline,
        "baseline_label": label,
        "ratio": ratio,
        "target": target,
        "pass": passed,
    }


def produce(args: argparse.Namespace) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="bench-postgres-") as name:
            tmp = Path(name)
            _log(args, f"appends: {args.producers} producers x {args.appends} …")
            appends = await bench_appends(args)
            _log(args, f"admission: {args.requests} sequential prompts each, taking turns …")
            admission = await bench_admission(args, tmp)
            _log(args, f"commit on A -> frame on B: {args.deliveries} prompts …")
            cross = await bench_cross_host(args, tmp)
            _log(args, f"failover: {args.failovers} SIGKILLs, ttl {args.lease_ttl_ms} ms …")
            failover = await bench_failover(args, tmp)
            _log(args, f"steps: {args.step_sessions} sessions x {args.step_rounds} prompts …")
            steps = await bench_steps(args, tmp)
        return {
            "appends": appends,
            "admission": admission,
            "cross_host": cross,
            "failover": failover,
            "steps": steps,
        }

    report = asyncio.run(run())
    ap, ad, cr, fo, st = (
        report[k] for k in ("appends", "admission", "cross_host", "failover", "steps")
    )
    ttl_s = fo["lease_ttl_ms"] / 1000
    rates = ap["store_events_per_s"]
    figures = [
        _figure(
            f"durable appends, {ap['producers']} producers (PostgresStore),"
            f" {ap['rounds']} rounds after {ap['warmup_rounds']} warm-up",
            rates["plain"],
            "events/s",
            ap["raw_executemany_projected_events_per_s"],
            "raw executemany, same rows + their projection writes, one transaction",
            f">= {TARGET_STORE_OVER_PROJECTED}x",
            ap["store_over_raw_projected"] >= TARGET_STORE_OVER_PROJECTED,
        ),
        _figure(
            "durable appends against raw executemany of the event rows alone",
            rates["plain"],
            "events/s",
            ap["raw_executemany_events_per_s"],
            "raw executemany, same rows, one transaction",
        ),
        *(
            _figure(
                f"a batch's events, {ap['event_form_chunk']} per statement: {form}",
                rate,
                "events/s",
                ap["event_forms_events_per_s"]["the store's statement"],
                "the store's statement (INSERT ... SELECT FROM unnest, positions and seqs in it)",
            )
            for form, rate in ap["event_forms_events_per_s"].items()
        ),
        _figure(
            f"raw asyncpg, 1 commit per row, {ap['producers']} tasks,"
            f" pool of {ap['raw_per_row_pool']}",
            ap["raw_per_row_txn_events_per_s"],
            "events/s",
            None,
            "",
        ),
        *(
            _figure(
                f"appends: CPU per event ({path} path), {side}",
                cpu[key],
                "us",
                ap["raw_cpu"][key],
                "raw executemany",
            )
            for path, cpu in ap["store_cpu"].items()
            for side, key in (
                ("this process's loop thread", "client_cpu_us_per_event"),
                ("the local server's processes", "server_cpu_us_per_event"),
            )
            if cpu[key] is not None
        ),
        _figure(
            "admission p50 over HTTP (PostgreSQL)",
            ad["postgres"]["p50_ms"],
            "ms",
            ad["sqlite"]["p50_ms"],
            "SQLite FULL, same run, alternating rounds",
            f"<= {TARGET_ADMIT_OVER_SQLITE}x SQLite",
            ad["postgres"]["p50_ms"] <= TARGET_ADMIT_OVER_SQLITE * ad["sqlite"]["p50_ms"],
        ),
        _figure(
            "admission p99 over HTTP (PostgreSQL)",
            ad["postgres"]["p99_ms"],
            "ms",
            ad["sqlite"]["p99_ms"],
            "SQLite FULL, same run, alternating rounds",
        ),
        _figure(
            "commit on host A -> SSE frame on host B, p50",
            cr["cross_host"]["p50_ms"],
            "ms",
            cr["same_host"]["p50_ms"],
            "follower on host A",
            "<= 5 ms",
            cr["cross_host"]["p50_ms"] <= TARGET_CROSS_HOST_P50_MS,
        ),
        _figure(
            "commit on host A -> SSE frame on host B, p99",
            cr["cross_host"]["p99_ms"],
            "ms",
            cr["same_host"]["p99_ms"],
            "follower on host A",
        ),
        _figure(
            f"failover: SIGKILL owner -> next event on B (median of {len(fo['runs_s'])})",
            fo["median_s"],
            "s",
            ttl_s,
            "lease ttl",
            f"<= {ttl_s + 1:g} s",
            fo["median_s"] <= ttl_s + 1,
        ),
        _figure(
            f"runtime steps, {st['sessions']} sessions x {st['rounds']} prompts (PostgreSQL)",
            st["postgres"]["steps_per_s"],
            "steps/s",
            st["sqlite"]["steps_per_s"],
            "SQLite FULL, same run",
        ),
    ]
    targets = [
        {
            "name": f"{f['name']} {f['target']}",
            "value": f["value"],
            "unit": f["unit"],
            "pass": f["pass"],
        }
        for f in figures
        if f["target"]
    ]
    return {
        **report,
        "load": os.getloadavg(),
        "figures": figures,
        "targets": targets,
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
    }


def _num(value: Any, unit: str) -> str:
    if value is None:
        return "-"
    if unit in ("events/s", "steps/s"):
        return f"{value:,.0f} {unit}"
    return f"{value:,.3f} {unit}"


def render(report: dict[str, Any]) -> str:
    lines = [f"{'figure':<62}{'value':>18}{'baseline (same run)':>22}{'ratio':>8}"]
    for f in report["figures"]:
        ratio = "-" if f["ratio"] is None else f"{f['ratio']:.2f}x"
        lines.append(
            f"{f['name']:<62}{_num(f['value'], f['unit']):>18}"
            f"{_num(f['baseline'], f['unit']):>22}{ratio:>8}"
            + (f"  ({f['baseline_label']})" if f["baseline_label"] else "")
        )
    fo = report["failover"]
    lines.append(f"failover runs (s): {fo['runs_s']}, next event on B: {fo['next_event_types']}")
    ap = report["appends"]
    lines.append(
        f"store appends: {ap['store_transactions']} transactions,"
        f" {ap['events_per_transaction']} events per commit,"
        f" {ap['store_transactions_begun_by_the_one_before']} begun in the COMMIT before;"
        f" server {ap['server_settings']}"
    )
    lines.append(
        f"store / raw projected: {ap['store_over_raw_projected']}x;"
        f" store / raw events only: {ap['store_over_raw_events']}x"
    )
    lines.append(f"load average at the end: {report['load']}")
    paths = report["steps"]["postgres"]["batch_paths"]
    lines.append(f"runtime steps on PostgreSQL, the store's batches by path: {paths}")
    lines += target_lines(report["targets"], _num, heading="targets (informational):")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="postgresql://postgres@127.0.0.1:5432")
    parser.add_argument("--producers", type=int, default=100)
    parser.add_argument(
        "--appends", type=int, default=50, help="appends per producer in each round"
    )
    parser.add_argument(
        "--append-rounds",
        type=int,
        default=3,
        help="rounds of appends, each followed by raw executemany of its rows (default 3)",
    )
    parser.add_argument(
        "--append-warmup",
        type=int,
        default=1,
        help="rounds of both before the timed ones, not counted (default 1)",
    )
    parser.add_argument("--requests", type=int, default=300, help="sequential admissions")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument(
        "--admission-rounds", type=int, default=6, help="turns of each backend's admissions"
    )
    parser.add_argument("--deliveries", type=int, default=200)
    parser.add_argument("--failovers", type=int, default=3)
    parser.add_argument("--lease-ttl-ms", type=int, default=2000)
    parser.add_argument("--step-sessions", type=int, default=100)
    parser.add_argument("--step-rounds", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quiet", action="store_true")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return report_main(lambda: produce(args), render, as_json=args.json, hard_limit_s=900)


if __name__ == "__main__":
    sys.exit(main())
