#!/usr/bin/env python3
"""HTTP admission, commit->SSE delivery and SSE replay, each next to a baseline from the same run.

    .venv/bin/python scripts/bench_http.py                  # table, synchronous=FULL
    .venv/bin/python scripts/bench_http.py --json           # one JSON object on stdout
    .venv/bin/python scripts/bench_http.py --requests 500 --events 20000 --quiet

The server is the real app (``server.app.make_app``) over a runtime on a fresh temp
data dir (``synchronous=FULL`` unless ``--synchronous``), served by an in-process
``web.AppRunner(handler_cancellation=True, access_log=None)`` on a ``TCPSite`` at
``127.0.0.1:0``, on this process's event loop, like ``sessionrt serve``. This script
adds benchmark-only routes to *its own copy* of the app before starting it (library
code is not modified):

* ``GET /__noop`` answers ``{}``: the baseline for a request/response round trip;
* ``GET /__noop/sse`` is a bare event stream and ``GET /__noop/poke?n=`` timestamps
  ``n`` and pushes one frame to it: the baseline for "something happened on the
  server -> the client has the frame".

The load generator is an ``aiohttp.ClientSession`` (the project's ``Client`` for one
extra replay figure) in a separate process (``ProcessPoolExecutor``, spawn), so it has
the other core and its own event loop, as a real client would; ``--inline-client``
runs it on the server's loop instead (client cost then lands on the server's loop,
and on every baseline alike). Connections are kept alive across requests. Every
figure is timed with ``time.perf_counter_ns`` (``CLOCK_MONOTONIC`` on Linux: one clock
for the whole machine, so timestamps taken in the server process and in the client
process compare directly; off Linux the client runs inline).

Phases (``--sessions`` S, ``--requests`` N, ``--concurrency`` C, ``--events`` E):

1. **Setup** (untimed): S sessions are created over HTTP (32 at a time).
2. **Admission, sequential.** N ``POST /api/session/{id}/prompt`` with
   ``{"text": ..., "resume": false}`` (admitted and committed, no execution runs),
   round-robin over the S sessions, one in flight, each followed by one
   ``GET /__noop``, alternating, so both see the same disk and loop weather.
   Latency = client send -> response body read. 100 warm-up pairs first.
3. **Admission, C in flight.** C client tasks share a counter; after a warm-up block
   of max(100, 2C) requests per kind (it opens every connection), N requests per
   kind, in two rounds of (N/2 no-op, N/2 prompts). admissions/s = requests / wall
   time of its rounds; latencies per request as above.
4. **Commit -> SSE delivery.** A fresh session's log is followed
   (``GET /api/experimental/session/{id}/log?follow=true``, after ``log.synced``)
   and ``/__noop/sse`` is open too. ``--deliveries`` times (sequential): a prompt to
   that session, then wait for its ``session.inbox.enqueued`` frame (matched by
   ``inboxID``); then a poke, then wait for its frame (the first 20 pairs are a
   warm-up and not counted). The commit is timestamped in
   the server process by a subscriber installed with ``runtime.store.subscribe``: it
   runs on the loop right after the writer thread's COMMIT is handed back (after the
   appenders' futures are resolved: it is the moment the log itself learns of the
   commit, so the writer thread -> loop hand-off, normally tens of microseconds, is
   not counted).
   The client timestamps the chunk that completed the frame. delivery = frame
   receipt - commit; baseline = frame receipt - poke timestamp. (The envelope's
   ``created`` is epoch *milliseconds*, taken before the commit: too coarse, and it
   includes the fsync.) Send -> frame and send -> HTTP response are reported too.
5. **Replay.** E ``SessionRenamed`` events are appended in-process to one fresh
   session (``runtime.store.append`` of commands of 100 events, 50 commands per
   ``asyncio.gather``; untimed), then a client reads
   ``GET .../log?after=0&follow=false`` up to the ``log.synced`` marker, splitting
   frames and ``orjson``-parsing each data line: events/s from send to the marker,
   best of two reads. The same read through ``protocol.client.Client``
   (``sessions.log``) is shown as well. Baseline: the same rows
   (``SELECT position, id, aggregate_id, seq, type, created, data ... ORDER BY
   seq``) with ``sqlite3`` fetchall on a read-only connection, best of two, in this
   process.

"ratio" is value / baseline (latency: how many times the no-op; throughput: the
fraction of the baseline rate). Targets (informational; 2 cores, FULL): admission p50
<= 2 ms and p99 <= 10 ms sequential; >= 3,000 admissions/s with 64 in flight; SSE
delivery p50 <= 2 ms; replay >= 50,000 events/s. The exit status is 0 unless the
benchmark itself fails. Numbers depend on the disk's fsync latency.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import multiprocessing
import os
import platform
import sqlite3
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Final

import aiohttp
import orjson
from _benchlib import percentile, report_main, target_lines
from aiohttp import web

from actors.runtime import RuntimeConfig
from protocol import events as ev
from protocol.client import Client
from protocol.operations import LogQuery
from server.app import RUNTIME, ServerSettings, make_app
from storage import Command, RecordedEvent

TARGET_ADMIT_P50_MS: Final = 2.0
TARGET_ADMIT_P99_MS: Final = 10.0
TARGET_ADMIT_PER_S: Final = 3_000
TARGET_CONCURRENCY: Final = 64
TARGET_DELIVERY_P50_MS: Final = 2.0
TARGET_REPLAY_PER_S: Final = 50_000

WARMUP: Final = 100
#: How long the delivery phase waits for one frame before it calls the run broken.
FRAME_TIMEOUT_S: Final = 10.0
EVENTS_PER_COMMAND: Final = 100
COMMANDS_PER_GATHER: Final = 50
JSON_HEADERS: Final = {"Content-Type": "application/json"}

clock = time.perf_counter_ns


def _log(args: argparse.Namespace, message: str) -> None:
    if not args.quiet:
        print(f"[bench_http] {message}", file=sys.stderr, flush=True)


def _ms_stats(ns: Sequence[int]) -> dict[str, float]:
    ms = [v / 1e6 for v in ns]
    return {
        "count": len(ms),
        "p50_ms": round(percentile(ms, 0.50), 3),
        "p90_ms": round(percentile(ms, 0.90), 3),
        "p99_ms": round(percentile(ms, 0.99), 3),
        "max_ms": round(max(ms, default=0.0), 3),
        "mean_ms": round(sum(ms) / len(ms), 3) if ms else 0.0,
    }


# -- client side (runs in the load-generator process, or inline) --------------------------------


@contextlib.asynccontextmanager
async def _http(limit: int) -> AsyncIterator[aiohttp.ClientSession]:
    connector = aiohttp.TCPConnector(limit=limit, force_close=False)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        yield http


async def _noop(http: aiohttp.ClientSession, base: str) -> None:
    async with http.get(base + "/__noop") as resp:
        body = await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"GET /__noop: {resp.status} {body[:200]!r}")


async def _prompt(http: aiohttp.ClientSession, base: str, session_id: str, i: int) -> str:
    payload = orjson.dumps({"text": f"bench prompt {i}", "resume": False})
    url = f"{base}/api/session/{session_id}/prompt"
    async with http.post(url, data=payload, headers=JSON_HEADERS) as resp:
        body = await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"POST prompt: {resp.status} {body[:200]!r}")
    return str(orjson.loads(body)["data"]["id"])


async def _create(http: aiohttp.ClientSession, base: str) -> str:
    payload = orjson.dumps({"title": "bench"})
    async with http.post(base + "/api/session", data=payload, headers=JSON_HEADERS) as resp:
        body = await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"POST /api/session: {resp.status} {body[:200]!r}")
    return str(orjson.loads(body)["data"]["id"])


FrameHandler = Callable[[int, int | None, bytes | None, bytes], bool]


async def _read_frames(resp: aiohttp.ClientResponse, on_frame: FrameHandler) -> int:
    """Split the stream into frames; ``on_frame(t_ns, id, event, data)`` returns True to stop.

    ``t_ns`` is when the chunk completing the frame arrived. Returns the bytes read.
    """
    buffer = b""
    total = 0
    async for chunk in resp.content.iter_any():
        t = clock()
        total += len(chunk)
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
            if data is not None and on_frame(t, fid, event, data):
                return total
    return total


class _Rendezvous:
    """Frames may arrive before the HTTP response that names them: meet by key."""

    def __init__(self) -> None:
        self._arrived: dict[str, tuple[int, int | None]] = {}
        self._waiting: dict[str, asyncio.Future[tuple[int, int | None]]] = {}

    def deliver(self, key: str, value: tuple[int, int | None]) -> None:
        future = self._waiting.pop(key, None)
        if future is None:
            self._arrived[key] = value
        elif not future.done():
            future.set_result(value)

    async def wait(self, key: str) -> tuple[int, int | None]:
        if key in self._arrived:
            return self._arrived.pop(key)
        future: asyncio.Future[tuple[int, int | None]] = asyncio.get_running_loop().create_future()
        self._waiting[key] = future
        async with asyncio.timeout(FRAME_TIMEOUT_S):
            return await future


async def job_create_sessions(base: str, count: int) -> list[str]:
    async with _http(32) as http:
        out: list[str] = []
        for start in range(0, count, 32):
            n = min(32, count - start)
            out += await asyncio.gather(*(_create(http, base) for _ in range(n)))
    return out


async def job_sequential(
    base: str, session_ids: list[str], requests: int, offset: int
) -> dict[str, list[int]]:
    s = len(session_ids)
    noop: list[int] = []
    admission: list[int] = []
    async with _http(1) as http:
        for i in range(WARMUP):
            await _noop(http, base)
            await _prompt(http, base, session_ids[(offset + i) % s], offset + i)
        for i in range(WARMUP, WARMUP + requests):
            t0 = clock()
            await _noop(http, base)
            t1 = clock()
            await _prompt(http, base, session_ids[(offset + i) % s], offset + i)
            t2 = clock()
            noop.append(t1 - t0)
            admission.append(t2 - t1)
    return {"noop": noop, "admission": admission}


async def job_concurrent(
    base: str, session_ids: list[str], requests: int, concurrency: int, offset: int
) -> dict[str, Any]:
    s = len(session_ids)
    out: dict[str, Any] = {
        "noop": {"latencies": [], "seconds": 0.0, "requests": 0},
        "admission": {"latencies": [], "seconds": 0.0, "requests": 0},
    }
    next_index = itertools.count(offset)
    async with _http(concurrency) as http:

        async def block(kind: str, n: int) -> tuple[list[int], float]:
            taken = itertools.count()
            latencies: list[int] = []

            async def worker() -> None:
                while next(taken) < n:
                    t0 = clock()
                    if kind == "noop":
                        await _noop(http, base)
                    else:
                        i = next(next_index)
                        await _prompt(http, base, session_ids[i % s], i)
                    latencies.append(clock() - t0)

            start = clock()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            return latencies, (clock() - start) / 1e9

        for kind in ("noop", "admission"):  # warm-up: open every connection
            await block(kind, max(WARMUP, 2 * concurrency))
        half = max(1, requests // 2)
        for _ in range(2):
            for kind in ("noop", "admission"):
                latencies, seconds = await block(kind, half)
                out[kind]["latencies"] += latencies
                out[kind]["seconds"] += seconds
                out[kind]["requests"] += len(latencies)
    return out


async def job_delivery(base: str, session_id: str, count: int, offset: int) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    log_rv = _Rendezvous()
    noop_rv = _Rendezvous()
    log_synced: asyncio.Future[None] = loop.create_future()
    noop_synced: asyncio.Future[None] = loop.create_future()

    def on_log(t: int, fid: int | None, event: bytes | None, data: bytes) -> bool:
        if event == b"log.synced":
            if not log_synced.done():
                log_synced.set_result(None)
        elif event == b"session.inbox.enqueued":
            log_rv.deliver(str(orjson.loads(data)["data"]["inboxID"]), (t, fid))
        return False

    def on_noop(t: int, fid: int | None, event: bytes | None, data: bytes) -> bool:
        if event == b"noop.synced":
            if not noop_synced.done():
                noop_synced.set_result(None)
        else:
            noop_rv.deliver(str(fid), (t, fid))
        return False

    admissions: list[tuple[int | None, int, int, int]] = []
    pokes: list[tuple[int, int, int, int]] = []
    async with _http(4) as http:
        url = f"{base}/api/experimental/session/{session_id}/log"
        async with (
            http.get(url, params={"follow": "true"}) as log_resp,
            http.get(base + "/__noop/sse") as noop_resp,
        ):
            if log_resp.status != 200 or noop_resp.status != 200:
                raise RuntimeError(f"streams: {log_resp.status} {noop_resp.status}")
            readers = [
                asyncio.ensure_future(_read_frames(log_resp, on_log)),
                asyncio.ensure_future(_read_frames(noop_resp, on_noop)),
            ]
            try:
                await asyncio.wait_for(asyncio.gather(log_synced, noop_synced), 10)
                for i in range(count + WARMUP // 5):
                    t0 = clock()
                    inbox_id = await _prompt(http, base, session_id, offset + i)
                    t1 = clock()
                    t_frame, seq = await log_rv.wait(inbox_id)
                    n = offset + i
                    t2 = clock()
                    async with http.get(base + "/__noop/poke", params={"n": str(n)}) as resp:
                        await resp.read()
                        if resp.status != 200:
                            raise RuntimeError(f"poke: {resp.status}")
                    t3 = clock()
                    t_poke_frame, _ = await noop_rv.wait(str(n))
                    if i >= WARMUP // 5:
                        admissions.append((seq, t0, t1, t_frame))
                        pokes.append((n, t2, t3, t_poke_frame))
            finally:
                for reader in readers:
                    reader.cancel()
                await asyncio.gather(*readers, return_exceptions=True)
    return {"admissions": admissions, "pokes": pokes}


async def job_replay(base: str, session_id: str) -> dict[str, Any]:
    count = 0
    synced_seq: int | None = None

    def on_frame(t: int, fid: int | None, event: bytes | None, data: bytes) -> bool:
        nonlocal count, synced_seq
        value = orjson.loads(data)
        if event == b"log.synced":
            synced_seq = value.get("seq")
            return True
        if fid is not None:
            count += 1
        return False

    async with _http(1) as http:
        url = f"{base}/api/experimental/session/{session_id}/log"
        start = clock()
        async with http.get(url, params={"after": "0", "follow": "false"}) as resp:
            if resp.status != 200:
                raise RuntimeError(f"log: {resp.status}")
            total = await _read_frames(resp, on_frame)
        seconds = (clock() - start) / 1e9
    return {"events": count, "seconds": seconds, "bytes": total, "synced_seq": synced_seq}


async def job_replay_client(base: str, session_id: str) -> dict[str, Any]:
    count = 0
    async with Client(base, timeout=120) as client:
        start = clock()
        async with client.sessions.log(session_id, LogQuery(after=0, follow=False)) as stream:
            async for event in stream:
                if event.event == "log.synced":
                    break
                if event.id is not None:
                    count += 1
        seconds = (clock() - start) / 1e9
    return {"events": count, "seconds": seconds}


JOBS: Final[dict[str, Callable[..., Coroutine[Any, Any, Any]]]] = {
    "create_sessions": job_create_sessions,
    "sequential": job_sequential,
    "concurrent": job_concurrent,
    "delivery": job_delivery,
    "replay": job_replay,
    "replay_client": job_replay_client,
}


def _run_job(name: str, kwargs: dict[str, Any]) -> Any:
    """Entry point in the load-generator process: one event loop per job."""
    return asyncio.run(JOBS[name](**kwargs))


class LoadGenerator:
    def __init__(self, inline: bool) -> None:
        self.inline = inline
        self._pool: ProcessPoolExecutor | None = None
        if not inline:
            context = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(max_workers=1, mp_context=context)

    async def run(self, name: str, **kwargs: Any) -> Any:
        if self._pool is None:
            return await JOBS[name](**kwargs)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, _run_job, name, kwargs)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


# -- server side --------------------------------------------------------------------------------


class NoopRoutes:
    """The benchmark's own baseline routes, added to its copy of the app."""

    def __init__(self) -> None:
        self.streams: set[asyncio.Queue[bytes]] = set()
        self.poked: dict[int, int] = {}

    def install(self, app: web.Application) -> None:
        app.router.add_get("/__noop", self.noop)
        app.router.add_get("/__noop/sse", self.sse)
        app.router.add_get("/__noop/poke", self.poke)

    async def noop(self, request: web.Request) -> web.Response:
        return web.Response(body=b"{}", content_type="application/json")

    async def sse(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        self.streams.add(queue)
        try:
            await response.write(b'event: noop.synced\ndata: {"type": "noop.synced"}\n\n')
            while True:
                await response.write(await queue.get())
        finally:
            self.streams.discard(queue)

    async def poke(self, request: web.Request) -> web.Response:
        n = int(request.query["n"])
        self.poked[n] = clock()
        data = b"id: %d\nevent: noop\ndata: %s\n\n" % (n, orjson.dumps({"n": n}))
        for queue in self.streams:
            queue.put_nowait(data)
        return web.Response(body=b"{}", content_type="application/json")


@contextlib.asynccontextmanager
async def serving(args: argparse.Namespace, data_dir: Path) -> AsyncIterator[tuple[str, Any, Any]]:
    # Sessions may not live in the data dir itself: give them a sibling.
    workdir = data_dir.parent / "project"
    workdir.mkdir(parents=True, exist_ok=True)
    config = RuntimeConfig(
        data_dir=data_dir, synchronous=args.synchronous, default_directory=str(workdir)
    )
    app = make_app(config=config, settings=ServerSettings())
    noop = NoopRoutes()
    noop.install(app)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=5)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}", app[RUNTIME], noop
    finally:
        await runner.cleanup()


async def fill_log(runtime: Any, session_id: str, events: int) -> float:
    """Append ``events`` SessionRenamed events to one session, in-process; returns seconds."""
    store = runtime.store
    start = clock()
    done = 0
    commands: list[Command] = []
    while done < events:
        n = min(EVENTS_PER_COMMAND, events - done)
        renames = [
            ev.SessionRenamed(session_id=session_id, title=f"t {done + k}") for k in range(n)
        ]
        commands.append(Command.of(*renames))
        done += n
        if len(commands) == COMMANDS_PER_GATHER or done >= events:
            await asyncio.gather(*(store.append(c) for c in commands))
            commands = []
    return (clock() - start) / 1e9


def raw_select(db_path: Path, session_id: str) -> tuple[int, float]:
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        start = clock()
        rows = conn.execute(
            "SELECT position, id, aggregate_id, seq, type, created, data FROM event"
            " WHERE aggregate_id = ? AND seq > ? ORDER BY seq",
            (session_id, 0),
        ).fetchall()
        seconds = (clock() - start) / 1e9
    finally:
        conn.close()
    return len(rows), seconds


def _rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else 0.0


async def run(args: argparse.Namespace) -> dict[str, Any]:
    inline = args.inline_client or not (
        sys.platform.startswith("linux")
        and "CLOCK_MONOTONIC" in time.get_clock_info("perf_counter").implementation
    )
    load = LoadGenerator(inline)
    try:
        with tempfile.TemporaryDirectory(prefix="bench_http-", dir=args.dir) as directory:
            data_dir = Path(directory) / "data"
            async with serving(args, data_dir) as (base, runtime, noop):
                return await _phases(args, load, base, runtime, noop, data_dir)
    finally:
        load.close()


async def _phases(
    args: argparse.Namespace,
    load: LoadGenerator,
    base: str,
    runtime: Any,
    noop: NoopRoutes,
    data_dir: Path,
) -> dict[str, Any]:
    _log(args, f"server on {base}; load generator {'inline' if load.inline else 'in a process'}")
    _log(args, f"creating {args.sessions} sessions ...")
    t = clock()
    session_ids: list[str] = await load.run("create_sessions", base=base, count=args.sessions)
    setup_s = (clock() - t) / 1e9

    profiler = None
    if args.profile:
        # The server's loop thread, in CPU time, over both admission phases.
        import cProfile

        profiler = cProfile.Profile(time.thread_time)
        profiler.enable()
    _log(args, f"admission, sequential: {args.requests} prompts + {args.requests} no-ops ...")
    seq = await load.run(
        "sequential", base=base, session_ids=session_ids, requests=args.requests, offset=0
    )

    _log(args, f"admission, {args.concurrency} in flight: {args.requests} each ...")
    conc = await load.run(
        "concurrent",
        base=base,
        session_ids=session_ids,
        requests=args.requests,
        concurrency=args.concurrency,
        offset=10 * args.requests,
    )
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(args.profile)
        _log(args, f"profile of the admission phases (server loop, CPU) in {args.profile}")

    _log(args, f"commit -> SSE delivery: {args.deliveries} prompts + pokes ...")
    followed: str = (await load.run("create_sessions", base=base, count=1))[0]
    committed: dict[int, int] = {}

    def on_commit(records: Sequence[RecordedEvent]) -> None:
        now = clock()
        for record in records:
            if record.aggregate_id == followed:
                committed[record.seq] = now

    unsubscribe = runtime.store.subscribe(on_commit)
    try:
        delivery = await load.run(
            "delivery", base=base, session_id=followed, count=args.deliveries, offset=0
        )
    finally:
        unsubscribe()
    commit_to_frame = [t_frame - committed[s] for s, _, _, t_frame in delivery["admissions"]]
    send_to_frame = [t_frame - t0 for _, t0, _, t_frame in delivery["admissions"]]
    send_to_response = [t1 - t0 for _, t0, t1, _ in delivery["admissions"]]
    poke_to_frame = [t_frame - noop.poked[n] for n, _, _, t_frame in delivery["pokes"]]
    poke_send_to_frame = [t_frame - t0 for _, t0, _, t_frame in delivery["pokes"]]
    poke_send_to_response = [t1 - t0 for _, t0, t1, _ in delivery["pokes"]]

    _log(args, f"replay: appending {args.events:,} events to one session ...")
    replayed: str = (await load.run("create_sessions", base=base, count=1))[0]
    append_s = await fill_log(runtime, replayed, args.events)
    expected = args.events + 1  # with its session.created
    _log(args, f"  {append_s:.2f} s; reading them over SSE, twice ...")
    replays = [await load.run("replay", base=base, session_id=replayed) for _ in range(2)]
    for r in replays:
        if r["events"] != expected or r["synced_seq"] != expected:
            raise RuntimeError(f"replay read {r['events']} events (synced {r['synced_seq']})")
    client_replay = await load.run("replay_client", base=base, session_id=replayed)
    raws = [raw_select(data_dir / "sessionrt.sqlite", replayed) for _ in range(2)]
    for rows, _ in raws:
        if rows != expected:
            raise RuntimeError(f"raw SELECT read {rows} rows, expected {expected}")
    best = min(replays, key=lambda r: r["seconds"])
    raw_best = min(s for _, s in raws)

    seq_adm, seq_noop = _ms_stats(seq["admission"]), _ms_stats(seq["noop"])
    conc_adm = _ms_stats(conc["admission"]["latencies"])
    conc_noop = _ms_stats(conc["noop"]["latencies"])
    conc_adm_rate = _rate(conc["admission"]["requests"], conc["admission"]["seconds"])
    conc_noop_rate = _rate(conc["noop"]["requests"], conc["noop"]["seconds"])
    delivery_stats = _ms_stats(commit_to_frame)
    poke_stats = _ms_stats(poke_to_frame)
    replay_rate = _rate(best["events"], best["seconds"])
    client_rate = _rate(client_replay["events"], client_replay["seconds"])
    raw_rate = _rate(expected, raw_best)

    c = args.concurrency
    figures = [
        _figure(
            "admission p50, sequential",
            seq_adm["p50_ms"],
            "ms",
            seq_noop["p50_ms"],
            "no-op route p50",
            f"<= {TARGET_ADMIT_P50_MS:g} ms",
            seq_adm["p50_ms"] <= TARGET_ADMIT_P50_MS,
        ),
        _figure(
            "admission p99, sequential",
            seq_adm["p99_ms"],
            "ms",
            seq_noop["p99_ms"],
            "no-op route p99",
            f"<= {TARGET_ADMIT_P99_MS:g} ms",
            seq_adm["p99_ms"] <= TARGET_ADMIT_P99_MS,
        ),
        _figure(
            f"admissions/s, {c} in flight",
            round(conc_adm_rate, 1),
            "/s",
            round(conc_noop_rate, 1),
            "no-op route req/s",
            f">= {TARGET_ADMIT_PER_S:,}/s" if c == TARGET_CONCURRENCY else None,
            conc_adm_rate >= TARGET_ADMIT_PER_S if c == TARGET_CONCURRENCY else None,
        ),
        _figure(
            f"admission p50, {c} in flight",
            conc_adm["p50_ms"],
            "ms",
            conc_noop["p50_ms"],
            "no-op route p50",
        ),
        _figure(
            f"admission p99, {c} in flight",
            conc_adm["p99_ms"],
            "ms",
            conc_noop["p99_ms"],
            "no-op route p99",
        ),
        _figure(
            "commit -> SSE frame p50",
            delivery_stats["p50_ms"],
            "ms",
            poke_stats["p50_ms"],
            "no-op poke -> frame p50",
            f"<= {TARGET_DELIVERY_P50_MS:g} ms",
            delivery_stats["p50_ms"] <= TARGET_DELIVERY_P50_MS,
        ),
        _figure(
            "commit -> SSE frame p99",
            delivery_stats["p99_ms"],
            "ms",
            poke_stats["p99_ms"],
            "no-op poke -> frame p99",
        ),
        _figure(
            f"replay {expected:,} events over SSE",
            round(replay_rate, 1),
            "events/s",
            round(raw_rate, 1),
            "raw sqlite3 SELECT rows/s",
            f">= {TARGET_REPLAY_PER_S:,} events/s",
            replay_rate >= TARGET_REPLAY_PER_S,
        ),
        _figure(
            "replay via protocol.client.Client",
            round(client_rate, 1),
            "events/s",
            round(raw_rate, 1),
            "raw sqlite3 SELECT rows/s",
        ),
    ]
    targets = [
        {"name": f"{f['name']} {f['target']}", "value": f["value"], "unit": f["unit"]}
        | {"pass": f["pass"]}
        for f in figures
        if f["target"] is not None
    ]
    return {
        "benchmark": "http",
        "synchronous": args.synchronous,
        "sessions": args.sessions,
        "requests": args.requests,
        "concurrency": c,
        "events": args.events,
        "load_generator": "inline" if load.inline else "process",
        "sqlite_version": sqlite3.sqlite_version,
        "python": platform.python_version(),
        "aiohttp": aiohttp.__version__,
        "cpus": os.cpu_count(),
        "setup_seconds": round(setup_s, 3),
        "admission_sequential": {"admission": seq_adm, "noop": seq_noop},
        "admission_concurrent": {
            "admission": conc_adm
            | {
                "requests": conc["admission"]["requests"],
                "seconds": round(conc["admission"]["seconds"], 4),
                "per_s": round(conc_adm_rate, 1),
            },
            "noop": conc_noop
            | {
                "requests": conc["noop"]["requests"],
                "seconds": round(conc["noop"]["seconds"], 4),
                "per_s": round(conc_noop_rate, 1),
            },
        },
        "delivery": {
            "commit_to_frame": delivery_stats,
            "send_to_frame": _ms_stats(send_to_frame),
            "send_to_response": _ms_stats(send_to_response),
            "noop_poke_to_frame": poke_stats,
            "noop_send_to_frame": _ms_stats(poke_send_to_frame),
            "noop_send_to_response": _ms_stats(poke_send_to_response),
        },
        "replay": {
            "events": expected,
            "append_seconds": round(append_s, 3),
            "append_events_per_s": round(_rate(args.events, append_s), 1),
            "reads": [
                {
                    "seconds": round(r["seconds"], 4),
                    "events_per_s": round(_rate(r["events"], r["seconds"]), 1),
                    "bytes": r["bytes"],
                }
                for r in replays
            ],
            "events_per_s": round(replay_rate, 1),
            "client_seconds": round(client_replay["seconds"], 4),
            "client_events_per_s": round(client_rate, 1),
            "raw_select_seconds": [round(s, 4) for _, s in raws],
            "raw_select_rows_per_s": round(raw_rate, 1),
        },
        "figures": figures,
        "targets": targets,
    }


def _figure(
    name: str,
    value: float,
    unit: str,
    baseline: float,
    baseline_label: str,
    target: str | None = None,
    passed: bool | None = None,
) -> dict[str, Any]:
    return {
        "name": name,
        "value": value,
        "unit": unit,
        "baseline": baseline,
        "baseline_label": baseline_label,
        "ratio": round(value / baseline, 2) if baseline else None,
        "target": target,
        "pass": passed,
    }


def _num(value: float, unit: str) -> str:
    if unit == "ms":
        return f"{value:.3f} ms"
    return f"{value:,.0f} {unit}"


def render(report: dict[str, Any]) -> str:
    headers = ("figure", "value", "baseline (same run)", "ratio", "target", "verdict")
    table = [
        (
            f["name"],
            _num(f["value"], f["unit"]),
            f"{_num(f['baseline'], f['unit'])} ({f['baseline_label']})",
            "-" if f["ratio"] is None else f"{f['ratio']:.2f}x",
            f["target"] or "-",
            {True: "PASS", False: "FAIL", None: "-"}[f["pass"]],
        )
        for f in report["figures"]
    ]
    widths = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(headers)]
    just = [str.ljust, str.rjust, str.rjust, str.rjust, str.ljust, str.ljust]
    lines = [
        f"sessionrt HTTP benchmark: synchronous={report['synchronous']}, "
        f"{report['sessions']:,} sessions, {report['requests']:,} requests per phase, "
        f"load generator {report['load_generator']}, aiohttp {report['aiohttp']}, "
        f"SQLite {report['sqlite_version']}, Python {report['python']}, {report['cpus']} CPUs",
        "",
        " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip(),
        "-+-".join("-" * w for w in widths),
    ]
    lines += [
        " | ".join(j(cell, w) for cell, w, j in zip(row, widths, just, strict=True)).rstrip()
        for row in table
    ]
    d = report["delivery"]
    r = report["replay"]
    lines += [
        "",
        f"delivery, end to end: send -> frame p50 {d['send_to_frame']['p50_ms']:.3f} ms "
        f"(HTTP response p50 {d['send_to_response']['p50_ms']:.3f} ms); no-op: send -> frame "
        f"p50 {d['noop_send_to_frame']['p50_ms']:.3f} ms "
        f"(response {d['noop_send_to_response']['p50_ms']:.3f} ms)",
        f"replay: {r['events']:,} events appended in-process in {r['append_seconds']:.2f} s "
        f"({r['append_events_per_s']:,.0f}/s); SSE reads "
        + ", ".join(f"{x['seconds']:.3f} s" for x in r["reads"])
        + f" ({r['reads'][0]['bytes'] / 1e6:.1f} MB); raw SELECT "
        + ", ".join(f"{s:.3f} s" for s in r["raw_select_seconds"]),
        "",
    ]
    lines += target_lines(report["targets"], _num, heading="targets (informational):")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--sessions", type=int, default=1000, help="sessions present (default: %(default)s)"
    )
    parser.add_argument(
        "--requests",
        type=int,
        default=2000,
        help="prompts (and as many no-op requests) per admission phase (default: %(default)s)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=TARGET_CONCURRENCY,
        help="requests in flight in the concurrent phase (default: %(default)s)",
    )
    parser.add_argument(
        "--deliveries",
        type=int,
        default=500,
        help="commit -> SSE samples (each with a no-op sample; default: %(default)s)",
    )
    parser.add_argument(
        "--events",
        type=int,
        default=100_000,
        help="events appended to one session and replayed over SSE (default: %(default)s)",
    )
    parser.add_argument(
        "--synchronous",
        choices=("FULL", "NORMAL"),
        type=str.upper,
        default="FULL",
        help="the runtime's PRAGMA synchronous (default: %(default)s)",
    )
    parser.add_argument(
        "--inline-client",
        action="store_true",
        help="run the load generator on the server's event loop, not in its own process",
    )
    parser.add_argument(
        "--dir", default=None, help="where the temp data dir goes (default: the system temp dir)"
    )
    parser.add_argument(
        "--profile",
        default="",
        metavar="PATH",
        help="cProfile the server's loop (CPU time) over the admission phases; stats to PATH",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)
    if min(args.sessions, args.requests, args.concurrency, args.deliveries, args.events) < 1:
        parser.error(
            "--sessions, --requests, --concurrency, --deliveries and --events must be positive"
        )
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return report_main(lambda: asyncio.run(run(args)), render, as_json=args.json, hard_limit_s=600)


if __name__ == "__main__":
    sys.exit(main())
