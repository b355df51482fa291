#!/usr/bin/env python3
"""The instance feed under load: many subscribers, a slow and a stuck one, and SIGINT.

    .venv/bin/python scripts/bench_feed.py                   # table
    .venv/bin/python scripts/bench_feed.py --json            # one JSON object on stdout
    .venv/bin/python scripts/bench_feed.py --subscribers 200 --rate 200 --seconds 10

Starts ``sessionrt serve --port 0`` (a real subprocess, fresh temp data dir,
``synchronous=FULL``, ``[server] stream_write_timeout_s`` = ``--write-timeout``).
Prompts (``resume: false``: admitted and committed, no step runs) go out at
``--rate`` per second over 8 sessions from this process (aiohttp, keep-alive).
Each prompt's text is ``bench <i> <sent_ns>``, its send time on
``time.monotonic_ns()`` (CLOCK_MONOTONIC: one clock for every process on the
host), so delivery = frame received - prompt sent is computed by the client
that receives it: it includes admission, the commit and its fsync, and the
fan-out. The clients are cheap on purpose, so that what is measured is the
server: the subscribers are non-blocking sockets under one bare epoll loop
per client process (``--workers``) that de-chunk and find prompts with
``bytes.find`` (no HTTP client library, no JSON), and the generator writes
prepared requests on keep-alive raw connections.

1. **Baseline** (same run, same server, same client code, same rate): one
   subscriber.
2. **Load**: ``--subscribers`` reading subscribers, plus one that never
   reads (a raw socket with a 4 KiB receive buffer) and one that reads 1 KiB
   every 100 ms. Reported: p50/p99/max delivery over every (subscriber,
   prompt) pair, how many reading subscribers were dropped (target 0) or had
   not received a prompt within 2 s after the last one was sent, and what the
   stuck and slow ones were told (``server.connection.dropped`` and its
   reason).
3. **SIGINT with followers attached**: every subscriber plus one session log
   follower stay connected; SIGINT -> process exit, and how many of them got
   ``server.instance.disposed`` / the end of their stream. Baseline: a second
   server with nothing attached, SIGINT -> exit.

During the load phase the server's RSS (``VmRSS``) is sampled every
``--rss-every`` seconds (10); ``--load-seconds`` makes that phase longer than
the others (``--load-seconds 600`` is the 10-minute run of issue #42). Reported:
the samples, and the drift from the first sample to the last, as a percentage
of the first (target: flat, within +-10 %), with the server's RSS before the
phase as its baseline.

For each phase: the admission round trip (prompt sent -> 200 received), how
far the generator fell behind its own schedule, and CPU over the phase as %
of one core (/proc): the server (all its threads), the client processes, the
generator, the whole machine, and the rest of the machine (other work).

Targets (issue #8): 200 subscribers at 200 admissions/s, none dropped, p99
delivery <= 50 ms; SIGINT -> exit with followers attached < 1 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import multiprocessing
import os
import platform
import re
import select
import signal
import socket
import sqlite3
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Final

import aiohttp
from _benchlib import report_main, target_lines

ROOT: Final = Path(__file__).resolve().parent.parent
SESSIONRT: Final = ROOT / ".venv" / "bin" / "sessionrt"
TARGET_P99_MS: Final = 50.0
TARGET_SIGINT_S: Final = 1.0
#: RSS over the load phase: last sample within this fraction of the first.
TARGET_RSS_DRIFT: Final = 0.10


def _rss_mib(pid: int) -> float:
    """``VmRSS`` of ``pid`` in MiB (/proc); NaN once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            found = re.search(r"^VmRSS:\s+(\d+) kB", f.read(), re.MULTILINE)
    except OSError:
        return math.nan
    return math.nan if found is None else int(found.group(1)) / 1024


async def _sample_rss(pid: int, every: float, into: list[tuple[float, float]]) -> None:
    """Append (seconds since start, RSS MiB) every ``every`` seconds until cancelled."""
    start = clock()
    while True:
        await asyncio.sleep(every)
        into.append((round(clock() - start, 1), round(_rss_mib(pid), 1)))


SESSIONS: Final = 8
JSON: Final = {"Content-Type": "application/json"}

clock = time.perf_counter


def _log(args: argparse.Namespace, message: str) -> None:
    if not args.quiet:
        print(message, file=sys.stderr, flush=True)


def _pct(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


class Server:
    def __init__(self, tmp: Path, write_timeout: float) -> None:
        self.tmp = tmp
        self.write_timeout = write_timeout
        self.proc: asyncio.subprocess.Process | None = None
        self.base = ""

    async def start(self, name: str) -> None:
        config = self.tmp / f"{name}.toml"
        config.write_text(f"[server]\nstream_write_timeout_s = {self.write_timeout}\n")
        work = self.tmp / "work"
        work.mkdir(exist_ok=True)
        self.proc = await asyncio.create_subprocess_exec(
            str(SESSIONRT),
            "serve",
            "--port",
            "0",
            "--data-dir",
            str(self.tmp / f"data-{name}"),
            "--config",
            str(config),
            stdout=asyncio.subprocess.PIPE,
            cwd=work,
        )
        assert self.proc.stdout is not None
        while True:
            line = (await asyncio.wait_for(self.proc.stdout.readline(), 60)).decode()
            if not line:
                raise RuntimeError("sessionrt serve exited before it was listening")
            found = re.search(r"listening on (http://\S+)", line)
            if found:
                self.base = found.group(1)
                return

    async def sigint(self) -> float:
        """SIGINT -> exit, in seconds."""
        assert self.proc is not None
        started = clock()
        self.proc.send_signal(signal.SIGINT)
        await asyncio.wait_for(self.proc.wait(), 60)
        return clock() - started

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


MARK: Final = b'"text":"bench '


class Reader:
    """One ``/api/event`` subscriber's parser: de-chunks, then scans bytes.

    Each prompt's text is ``bench <i> <sent_ns>`` (``time.monotonic_ns()``
    when the load generator sent it: CLOCK_MONOTONIC, one clock for every
    process on this host), so a frame's delivery is computed where it lands,
    with no table shared between processes and no JSON parsing: the cost per
    received chunk is a few ``bytes.find`` calls.
    """

    def __init__(self, latencies: list[float]) -> None:
        self.latencies = latencies
        self.seen: set[int] = set()
        self.events: list[str] = []
        self.connected = False
        self.closed = False
        self._head = b""
        self._in_body = False
        self._left = 0  # bytes of the current HTTP chunk still to come
        self._size_line = b""
        self._frames = b""  # SSE bytes after the last complete frame

    def feed(self, now: int, data: bytes) -> None:
        if not self._in_body:
            self._head += data
            _, sep, data = self._head.partition(b"\r\n\r\n")
            if not sep:
                return
            self._in_body, self._head = True, b""
        body = []
        pos, size = 0, len(data)
        while pos < size:
            if self._left == 0:
                if self._size_line:  # a size line cut by the last read
                    data, pos = self._size_line + data[pos:], 0
                    size, self._size_line = len(data), b""
                line_end = data.find(b"\r\n", pos)
                if line_end < 0:
                    self._size_line = data[pos:]
                    break
                line = data[pos:line_end]
                pos = line_end + 2
                if not line:
                    continue  # the CRLF that ends a chunk's data
                self._left = int(line, 16)
                if self._left == 0:
                    break  # the last chunk
                continue
            take = min(self._left, size - pos)
            body.append(data[pos : pos + take])
            pos += take
            self._left -= take
        if body:
            self._scan(now, body[0] if len(body) == 1 else b"".join(body))

    def _scan(self, now: int, data: bytes) -> None:
        buf = self._frames + data if self._frames else data
        cut = buf.rfind(b"\n\n")
        if cut < 0:
            self._frames = buf
            return
        self._frames = buf[cut + 2 :]
        at = buf.find(MARK, 0, cut)
        while at >= 0:
            start = at + len(MARK)
            space = buf.index(b" ", start)
            quote = buf.index(b'"', space)
            index = int(buf[start:space])
            if index not in self.seen:
                self.seen.add(index)
                self.latencies.append((now - int(buf[space + 1 : quote])) / 1e6)
            at = buf.find(MARK, quote, cut)
        if b"event: server." in buf[:cut]:
            for name in re.findall(rb"event: (server\.[\w.]+)", buf[:cut]):
                self.events.append(name.decode())
                self.connected = True


class _Follow(asyncio.Protocol):
    """A :class:`Reader` on an asyncio connection (this process's own follower)."""

    def __init__(self, request: bytes) -> None:
        self.request = request
        self.reader = Reader([])
        self.closed = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.reader.feed(time.monotonic_ns(), data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed.set()


def _request(host: str, port: int, path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()


_READY: Any = None
_STOPS: dict[str, Any] = {}


def _init_worker(ready: Any, stops: dict[str, Any]) -> None:
    global _READY
    _READY = ready
    _STOPS.update(stops)


def _worker(base: str, count: int, phase: str) -> dict[str, Any]:
    """In a client process: ``count`` subscribers until the server ends them or ``phase`` stops.

    A bare epoll loop over non-blocking sockets, so a received chunk costs one
    ``recv`` and :meth:`Reader.feed`, nothing more.
    """
    stop = _STOPS[phase]
    host, port_text = base.removeprefix("http://").rsplit(":", 1)
    port = int(port_text)
    latencies: list[float] = []
    readers = [Reader(latencies) for _ in range(count)]
    poll = select.epoll()
    open_: dict[int, tuple[socket.socket, Reader]] = {}
    for reader in readers:
        sock = socket.create_connection((host, port))
        sock.sendall(_request(host, port, "/api/event"))
        sock.setblocking(False)
        open_[sock.fileno()] = (sock, reader)
        poll.register(sock.fileno(), select.EPOLLIN)
    waiting = count  # readers without server.connected yet
    cpu0 = 0.0
    reads = 0
    deadline = clock() + 60
    while open_ and not stop.is_set():
        for fd, _ in poll.poll(0.05):
            sock, reader = open_[fd]
            try:
                data = sock.recv(1 << 18)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                poll.unregister(fd)
                sock.close()
                del open_[fd]
                reader.closed = True
                continue
            reads += 1
            was = reader.connected
            reader.feed(time.monotonic_ns(), data)
            if reader.connected and not was:
                waiting -= 1
                if waiting == 0:
                    cpu0 = time.process_time()
                    _READY.put(os.getpid())
        if waiting and clock() > deadline:
            raise RuntimeError(f"{waiting} subscribers never got server.connected")
    for sock, _ in open_.values():
        sock.close()
    poll.close()
    return {
        "latencies": latencies,
        "seen": [len(r.seen) for r in readers],
        "events": [r.events for r in readers],
        "cpu_s": time.process_time() - cpu0,
        "reads": reads,
    }


async def _stuck(base: str) -> socket.socket:
    host, port = base.removeprefix("http://").rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (host, int(port)))
    await loop.sock_sendall(sock, f"GET /api/event HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    return sock


async def _slow(sock: socket.socket, stop: asyncio.Event) -> None:
    """Reads 1 KiB every 100 ms until ``stop``."""
    loop = asyncio.get_running_loop()
    with contextlib.suppress(OSError):
        while await loop.sock_recv(sock, 1024):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.1)
            if stop.is_set():
                return


class _Post(asyncio.Protocol):
    """One keep-alive connection of the load generator: one request at a time."""

    def __init__(self, done: Any) -> None:
        self.done = done
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.sent = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def send(self, request: bytes, sent: int) -> None:
        assert self.transport is not None
        self.sent = sent
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buf[:end].lower()
        at = head.find(b"content-length:")
        length = int(head[at + 15 : head.find(b"\r\n", at)]) if at >= 0 else 0
        if len(self.buf) < end + 4 + length:
            return
        status, self.buf = self.buf[9:12], self.buf[end + 4 + length :]
        self.done(self, status, self.sent)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


class Admissions:
    """Prompts at a fixed rate over keep-alive raw connections; each text carries its send time.

    No HTTP client library: a request is one prepared write, its answer one
    ``find`` for the end of the headers, so the generator's own cost stays
    small next to the server's.
    """

    def __init__(self, base: str, sessions: list[str]) -> None:
        host, port = base.removeprefix("http://").rsplit(":", 1)
        self.host, self.port = host, int(port)
        self.sessions = sessions
        self.acks: list[float] = []
        self.failures: list[bytes] = []
        self.late_ms = 0.0  # how far the generator itself fell behind its schedule
        self._idle: list[_Post] = []
        self._outstanding = 0
        self._settled: asyncio.Event = asyncio.Event()

    def _done(self, conn: _Post, status: bytes, sent: int) -> None:
        self.acks.append((time.monotonic_ns() - sent) / 1e6)
        if status != b"200":
            self.failures.append(status)
        self._idle.append(conn)
        self._outstanding -= 1
        if self._outstanding == 0:
            self._settled.set()

    async def _open(self) -> _Post:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(lambda: _Post(self._done), self.host, self.port)
        return conn

    def _request(self, i: int) -> bytes:
        sent = time.monotonic_ns()
        body = b'{"text":"bench %d %d","resume":false}' % (i, sent)
        path = f"/api/session/{self.sessions[i % len(self.sessions)]}/prompt"
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body

    async def run(self, rate: float, seconds: float) -> int:
        count = int(rate * seconds)
        while len(self._idle) < 32:
            self._idle.append(await self._open())
        self.acks, self.failures = [], []
        self._settled.clear()
        opening: set[asyncio.Task[None]] = set()

        async def send_on_new(i: int) -> None:
            conn = await self._open()
            conn.send(self._request(i), time.monotonic_ns())

        start = clock()
        for i in range(count):
            delay = start + i / rate - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                self.late_ms = max(self.late_ms, -delay * 1000)
            self._outstanding += 1
            while self._idle and self._idle[-1].transport is None:
                self._idle.pop()
            if self._idle:
                self._idle.pop().send(self._request(i), time.monotonic_ns())
            else:
                task = asyncio.ensure_future(send_on_new(i))
                opening.add(task)
                task.add_done_callback(opening.discard)
        if self._outstanding:
            await asyncio.wait_for(self._settled.wait(), 60)
        assert not self.failures, f"prompts refused: {self.failures[:5]}"
        return count


def _summary(latencies: Sequence[float], expected: int, seen: Sequence[int]) -> dict[str, Any]:
    return {
        "pairs": len(latencies),
        "missing": sum(max(0, expected - n) for n in seen),
        "p50_ms": round(_pct(latencies, 0.5), 3),
        "p99_ms": round(_pct(latencies, 0.99), 3),
        "max_ms": round(max(latencies, default=math.nan), 3),
    }


class CPU:
    """CPU seconds of given pids and of the whole machine, between two marks (/proc)."""

    def __init__(self) -> None:
        self.tick = os.sysconf("SC_CLK_TCK")

    def machine(self) -> tuple[float, float, float]:
        """Busy (not idle, iowait or steal), softirq and steal seconds, all CPUs."""
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
        idle, steal, softirq = fields[3] + fields[4], fields[7], fields[6]
        return (sum(fields) - idle - steal) / self.tick, softirq / self.tick, steal / self.tick

    def process(self, pid: int) -> float:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            return math.nan
        return (int(fields[11]) + int(fields[12])) / self.tick


def _share(busy: float, wall: float) -> float:
    """CPU seconds per wall second, as a percentage of one core."""
    return round(100 * busy / wall, 1) if wall > 0 else math.nan


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-feed-") as tmp:
        server = Server(Path(tmp), args.write_timeout)
        try:
            await server.start("load")
            report = await _load(args, server)
        finally:
            await server.stop()
        idle = Server(Path(tmp), args.write_timeout)
        try:
            await idle.start("idle")
            report["sigint_idle_s"] = round(await idle.sigint(), 3)
        finally:
            await idle.stop()
    return _report(args, report)


async def _phase(
    args: argparse.Namespace,
    server: Server,
    admissions: Admissions,
    pool: ProcessPoolExecutor,
    ready: Any,
    phase: str,
    subscribers: int,
    extra: Any = None,
) -> tuple[dict[str, Any], list[asyncio.Future[dict[str, Any]]]]:
    """``subscribers`` readers in client processes, prompts at ``--rate``: delivery and CPU."""
    loop = asyncio.get_running_loop()
    assert server.proc is not None
    workers = max(1, min(args.workers, subscribers))
    shares = [subscribers // workers + (i < subscribers % workers) for i in range(workers)]
    jobs = [loop.run_in_executor(pool, _worker, server.base, n, phase) for n in shares]
    pids = [await loop.run_in_executor(None, ready.get, True, 120) for _ in shares]
    if extra is not None:
        await extra()
    cpu = CPU()
    t0, (busy0, softirq0, steal0) = clock(), cpu.machine()
    server0 = cpu.process(server.proc.pid)
    clients0 = sum(cpu.process(p) for p in pids)
    me0 = time.process_time()
    rss_before = _rss_mib(server.proc.pid)
    samples: list[tuple[float, float]] = []
    sampler = asyncio.ensure_future(_sample_rss(server.proc.pid, args.rss_every, samples))
    seconds = args.load_seconds if phase == "load" else args.seconds
    try:
        sent = await admissions.run(args.rate, seconds)
    finally:
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
    samples.append((round(clock() - t0, 1), round(_rss_mib(server.proc.pid), 1)))
    wall = clock() - t0
    busy1, softirq1, steal1 = cpu.machine()
    server1 = cpu.process(server.proc.pid)
    clients1 = sum(cpu.process(p) for p in pids)
    me1 = time.process_time()
    return {
        "sent": sent,
        "wall_s": round(wall, 3),
        "rss_before_mib": round(rss_before, 1),
        "rss_mib": samples,
        "ack_p50_ms": round(_pct(admissions.acks, 0.5), 3),
        "ack_p99_ms": round(_pct(admissions.acks, 0.99), 3),
        "generator_late_ms": round(admissions.late_ms, 3),
        "cpu_server_pct": _share(server1 - server0, wall),
        "cpu_clients_pct": _share(clients1 - clients0, wall),
        "cpu_generator_pct": _share(me1 - me0, wall),
        "cpu_machine_pct": _share(busy1 - busy0, wall),
        "cpu_softirq_pct": _share(softirq1 - softirq0, wall),
        "cpu_steal_pct": _share(steal1 - steal0, wall),
        "cpu_other_pct": _share(
            (busy1 - busy0) - (server1 - server0) - (clients1 - clients0) - (me1 - me0), wall
        ),
    }, jobs


def _merge(results: Sequence[dict[str, Any]], sent: int) -> dict[str, Any]:
    latencies = [x for r in results for x in r["latencies"]]
    seen = [n for r in results for n in r["seen"]]
    return {**_summary(latencies, sent, seen), "client_reads": sum(r["reads"] for r in results)}


async def _load(args: argparse.Namespace, server: Server) -> dict[str, Any]:
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
    async with aiohttp.ClientSession(
        server.base, connector=connector, timeout=timeout, headers=JSON
    ) as http:
        sessions = []
        for _ in range(SESSIONS):
            async with http.post("/api/session", json={}) as r:
                sessions.append((await r.json())["data"]["id"])
        admissions = Admissions(server.base, sessions)
        ctx = multiprocessing.get_context("spawn")
        ready = ctx.Queue()
        stops = {"baseline": ctx.Event(), "load": ctx.Event()}
        with ProcessPoolExecutor(
            max(1, args.workers),
            mp_context=ctx,
            initializer=_init_worker,
            initargs=(ready, stops),
        ) as pool:
            # 1. Baseline: one subscriber, same client code, same server, same rate.
            _log(args, f"baseline: 1 subscriber, {args.rate:g}/s for {args.seconds:g} s")
            base_cpu, jobs = await _phase(args, server, admissions, pool, ready, "baseline", 1)
            await asyncio.sleep(1)  # the frames in flight land
            stops["baseline"].set()
            base_results = await asyncio.gather(*jobs)
            baseline = {**_merge(base_results, base_cpu["sent"]), **base_cpu}

            # 2. Load: many subscribers in client processes, a stuck one and a slow one.
            _log(args, f"load: {args.subscribers} subscribers + a stuck and a slow one")
            stuck: list[socket.socket] = []
            slow_stop = asyncio.Event()
            background: set[asyncio.Task[None]] = set()

            async def odd_ones() -> None:
                stuck.append(await _stuck(server.base))
                stuck.append(await _stuck(server.base))
                task = asyncio.ensure_future(_slow(stuck[1], slow_stop))
                background.add(task)

            load_cpu, jobs = await _phase(
                args, server, admissions, pool, ready, "load", args.subscribers, odd_ones
            )
            await asyncio.sleep(2)  # the frames in flight land; then the streams end at SIGINT
            slow_stop.set()
            # The stuck and the slow one: read what they were sent, without blocking the loop.
            stuck_events = await _drain_stuck(stuck[0], args.write_timeout * 2 + 2)
            slow_events = await _drain_stuck(stuck[1], args.write_timeout * 2 + 2)
            for sock in stuck:
                sock.close()

            # 3. SIGINT with every subscriber and a log follower attached.
            host, port = server.base.removeprefix("http://").rsplit(":", 1)
            path = f"/api/experimental/session/{sessions[0]}/log?follow=true"
            _, follower = await asyncio.get_running_loop().create_connection(
                lambda: _Follow(_request(host, int(port), path)), host, int(port)
            )
            await asyncio.sleep(0.5)
            _log(args, "SIGINT with followers attached")
            sigint_s = await server.sigint()
            stops["load"].set()  # in case a stream outlives the server
            results = await asyncio.wait_for(asyncio.gather(*jobs), 60)
            await asyncio.wait_for(follower.closed.wait(), 30)
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
    load = {**_merge(results, load_cpu["sent"]), **load_cpu}
    events = [e for r in results for e in r["events"]]
    dropped = sum(1 for e in events if "server.connection.dropped" in e)
    disposed = sum(1 for e in events if e[-1:] == ["server.instance.disposed"])
    return {
        "baseline": baseline,
        "load": load,
        "dropped_reading": dropped,
        "stuck_told": stuck_events,
        "slow_told": slow_events,
        "sigint_s": round(sigint_s, 3),
        "disposed": disposed,
        "follower_ended": follower.closed.is_set(),
    }


async def _drain_stuck(sock: socket.socket, within: float) -> dict[str, Any]:
    """What a stuck (or slow) subscriber was sent: its last ``server.*`` events, and bytes.

    An empty list means it was not dropped: all it was sent fit in the socket
    buffers, so no write was ever held up.
    """
    loop = asyncio.get_running_loop()
    data, total = b"", 0
    with contextlib.suppress(TimeoutError, OSError):
        async with asyncio.timeout(within):
            while chunk := await loop.sock_recv(sock, 1 << 16):
                total += len(chunk)
                data = (data + chunk)[-65536:]
    told = [m.decode() for m in re.findall(rb"event: (server\.[\w.]+)", data)]
    reasons = [m.decode() for m in re.findall(rb'"reason":"(\w+)"', data)]
    return {"told": told[-2:], "reasons": reasons[-1:], "bytes": total}


def _figure(
    name: str,
    value: float,
    unit: str,
    baseline: float | None,
    label: str,
    target: str | None = None,
    passed: bool | None = None,
) -> dict[str, Any]:
    return {
        "name": name,
        "value": value,
        "unit": unit,
        "baseline": baseline,
        "baseline_label": label,
        "ratio": round(value / baseline, 2) if baseline else None,
        "target": target,
        "pass": passed,
    }


def _report(args: argparse.Namespace, r: dict[str, Any]) -> dict[str, Any]:
    n = args.subscribers
    base, load = r["baseline"], r["load"]
    p99_ok = load["p99_ms"] <= TARGET_P99_MS
    none_dropped = r["dropped_reading"] == 0 and load["missing"] == 0
    sigint_ok = r["sigint_s"] < TARGET_SIGINT_S
    rss = load["rss_mib"]
    first, last = rss[0][1], rss[-1][1]
    drift = (last - first) / first if first else math.nan
    label = f"1 subscriber, {args.rate:g}/s"
    figures = [
        _figure(f"delivery p50, {n} subscribers", load["p50_ms"], "ms", base["p50_ms"], label),
        _figure(
            f"delivery p99, {n} subscribers at {args.rate:g}/s",
            load["p99_ms"],
            "ms",
            base["p99_ms"],
            label,
            f"<= {TARGET_P99_MS:g} ms",
            p99_ok,
        ),
        _figure(f"delivery max, {n} subscribers", load["max_ms"], "ms", base["max_ms"], label),
        _figure(
            "reading subscribers dropped or missing a frame",
            r["dropped_reading"] + load["missing"],
            "",
            None,
            "-",
            "0",
            none_dropped,
        ),
        _figure(
            f"server RSS at the end of the load phase ({len(rss)} samples,"
            f" every {args.rss_every:g} s, first {first:g} MiB)",
            last,
            "MiB",
            load["rss_before_mib"],
            "RSS before the load phase",
        ),
        _figure(
            f"RSS drift over {args.load_seconds:g} s of load, last sample vs first",
            round(100 * drift, 1),
            "%",
            None,
            "-",
            f"within +-{100 * TARGET_RSS_DRIFT:g} %",
            abs(drift) <= TARGET_RSS_DRIFT,
        ),
        _figure(
            f"SIGINT -> exit, {n} subscribers + 1 log follower attached",
            r["sigint_s"] * 1000,
            "ms",
            r["sigint_idle_s"] * 1000,
            "SIGINT -> exit, nothing attached",
            f"< {TARGET_SIGINT_S * 1000:g} ms",
            sigint_ok,
        ),
    ]
    return {
        "python": platform.python_version(),
        "sqlite_version": sqlite3.sqlite_version,
        "aiohttp": aiohttp.__version__,
        "cpus": os.cpu_count(),
        "subscribers": n,
        "rate": args.rate,
        "seconds": args.seconds,
        "write_timeout_s": args.write_timeout,
        "workers": args.workers,
        **r,
        "figures": figures,
        "targets": [
            {
                "name": f["name"] + f" {f['target']}",
                "value": f["value"],
                "unit": f["unit"],
                "pass": f["pass"],
            }
            for f in figures
            if f["target"]
        ],
    }


def _num(value: Any, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "ms":
        return f"{value:,.3f} ms"
    if unit in ("MiB", "%"):
        return f"{value:,.1f} {unit}"
    return f"{value:,.0f} {unit}".strip()


def render(report: dict[str, Any]) -> str:
    lines = [
        f"sessionrt feed benchmark: {report['subscribers']} subscribers, {report['rate']:g}"
        f" admissions/s for {report['seconds']:g} s, write timeout {report['write_timeout_s']:g} s,"
        f" {report['workers']} client processes, aiohttp {report['aiohttp']},"
        f" SQLite {report['sqlite_version']},"
        f" Python {report['python']}, {report['cpus']} CPUs",
        "",
    ]
    for f in report["figures"]:
        base = (
            ""
            if f["baseline"] is None
            else f" (baseline {_num(f['baseline'], f['unit'])}, {f['baseline_label']})"
        )
        lines.append(f"  {f['name']}: {_num(f['value'], f['unit'])}{base}")
    lines.append("")
    for name in ("baseline", "load"):
        p = report[name]
        lines.append(
            f"  {name}: {p['sent']} prompts in {p['wall_s']:g} s; admission round trip"
            f" p50 {p['ack_p50_ms']:.1f} ms p99 {p['ack_p99_ms']:.1f} ms; generator behind its"
            f" schedule by up to {p['generator_late_ms']:.1f} ms"
        )
        lines.append(
            f"    CPU (% of one core): server {p['cpu_server_pct']}, clients"
            f" {p['cpu_clients_pct']}, generator {p['cpu_generator_pct']}, other work"
            f" {p['cpu_other_pct']} (softirq {p['cpu_softirq_pct']}); machine busy"
            f" {p['cpu_machine_pct']} of {100 * (report['cpus'] or 1)}, stolen by the"
            f" hypervisor {p['cpu_steal_pct']}"
        )
    lines.append(
        "  load-phase RSS (s, MiB): "
        + ", ".join(f"{t:g}:{m:g}" for t, m in report["load"]["rss_mib"])
    )
    lines += [
        "",
        f"  the stuck subscriber (never reads) was told: {report['stuck_told']}",
        f"  the slow subscriber (1 KiB / 100 ms) was told: {report['slow_told']}",
        f"  at SIGINT: {report['disposed']}/{report['subscribers']} subscribers got"
        f" server.instance.disposed; the log follower's stream ended: {report['follower_ended']}",
        "",
    ]
    lines += target_lines(report["targets"], _num, heading="targets (informational):")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--subscribers", type=int, default=200)
    parser.add_argument("--rate", type=float, default=200.0, help="admissions per second")
    parser.add_argument("--seconds", type=float, default=10.0, help="per phase")
    parser.add_argument(
        "--load-seconds",
        type=float,
        default=None,
        help="the load phase alone (default: --seconds; 600 for the 10-minute run)",
    )
    parser.add_argument(
        "--rss-every", type=float, default=10.0, help="server RSS sampled every (s), load phase"
    )
    parser.add_argument(
        "--write-timeout", type=float, default=2.0, help="[server] stream_write_timeout_s"
    )
    parser.add_argument(
        "--workers", type=int, default=1, help="client processes for the subscribers"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = parser.parse_args(argv)
    if args.load_seconds is None:
        args.load_seconds = args.seconds
    if args.load_seconds <= 0 or args.rss_every <= 0:
        parser.error("--load-seconds and --rss-every must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    limit = 900 + args.load_seconds - args.seconds
    return report_main(
        lambda: asyncio.run(run(args)), render, as_json=args.json, hard_limit_s=limit
    )


if __name__ == "__main__":
    sys.exit(main())
