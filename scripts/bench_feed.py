#!/usr/bin/env python3
"""The instance feed under load: many subscribers, a slow and a stuck one, and SIGINT.

    .venv/bin/python scripts/bench_feed.py                   # table
    .venv/bin/python scripts/bench_feed.py --json            # one JSON object on stdout
    .venv/bin/python scripts/bench_feed.py --subscribers 200 --rate 200 --seconds 10

Starts ``sessionrt serve --port 0`` (a real subprocess, fresh temp data dir,
``synchronous=FULL``, ``[server] stream_write_timeout_s`` = ``--write-timeout``)
and drives it from this process with aiohttp:

1. **Baseline** (same run, same server): one ``/api/event`` subscriber while
   prompts (``resume: false``, admitted and committed, no step runs) are sent
   at ``--rate`` per second over 8 sessions for ``--seconds``. Each prompt
   carries a client-chosen id; delivery = the moment a subscriber has the
   ``session.inbox.enqueued`` frame with that id - the moment the prompt was
   sent (so it includes the commit and its fsync, and is an upper bound on
   commit -> frame).
2. **Load**: ``--subscribers`` reading subscribers, plus one subscriber that
   never reads (a raw socket with a 4 KiB receive buffer) and one that reads
   1 KiB every 100 ms; the same prompts at the same rate. The reading
   subscribers live in ``--workers`` client processes (spawned; Linux's
   ``perf_counter`` is CLOCK_MONOTONIC, one clock for every process). Reported: p50/p99/max
   delivery over every (subscriber, prompt) pair, how many reading subscribers
   were dropped (target 0) or missed a frame, and what the stuck and slow ones
   were told (``server.connection.dropped`` and its reason).
3. **SIGINT with followers attached**: every subscriber plus one session log
   follower stay connected; SIGINT -> process exit, and how many of them got
   ``server.instance.disposed`` / the end of their stream. Baseline: a second
   server with nothing attached, SIGINT -> exit.

Targets (issue #8): 200 subscribers at 200 admissions/s, none dropped, p99
delivery <= 50 ms; SIGINT -> exit with followers attached < 1 s.
Client and server share this machine's cores: the client's parsing is counted
in every delivery figure, the baseline's included.
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

from protocol import ids

ROOT: Final = Path(__file__).resolve().parent.parent
SESSIONRT: Final = ROOT / ".venv" / "bin" / "sessionrt"
TARGET_P99_MS: Final = 50.0
TARGET_SIGINT_S: Final = 1.0
SESSIONS: Final = 8
ENQUEUED: Final = re.compile(
    rb'event: session\.inbox\.enqueued\n(?:id: \d+\n)?data: .*?"(msg_\w+)"'
)
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


class Subscriber:
    """Reads ``/api/event``, timestamping each enqueued prompt id it sees."""

    def __init__(self) -> None:
        self.seen: dict[str, float] = {}
        self.events: list[str] = []
        self.ended = asyncio.Event()
        self.connected = asyncio.Event()

    async def run(self, http: aiohttp.ClientSession, path: str = "/api/event") -> None:
        try:
            async with http.get(path) as response:
                buffer = b""
                async for chunk in response.content.iter_any():
                    now = clock()
                    buffer += chunk
                    head, sep, buffer = buffer.rpartition(b"\n\n")
                    if not sep:
                        buffer = head + buffer
                        continue
                    for found in ENQUEUED.finditer(head):
                        self.seen[found.group(1).decode()] = now
                    for name in re.findall(rb"event: (server\.[\w.]+|log\.synced)", head):
                        self.events.append(name.decode())
                        self.connected.set()
        except (aiohttp.ClientError, asyncio.CancelledError):
            pass
        finally:
            self.ended.set()


_READY: Any = None


def _init_worker(ready: Any) -> None:
    global _READY
    _READY = ready


def _worker(base: str, count: int) -> list[dict[str, Any]]:
    """In a worker process: ``count`` subscribers until the server ends their streams."""
    return asyncio.run(_worker_main(base, count))


async def _worker_main(base: str, count: int) -> list[dict[str, Any]]:
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
    async with aiohttp.ClientSession(base, connector=connector, timeout=timeout) as http:
        subs = [Subscriber() for _ in range(count)]
        tasks = [asyncio.ensure_future(sub.run(http)) for sub in subs]
        await asyncio.wait_for(asyncio.gather(*(s.connected.wait() for s in subs)), 60)
        _READY.put(count)
        await asyncio.gather(*tasks)
    return [{"seen": s.seen, "events": s.events} for s in subs]


async def _stuck(base: str) -> socket.socket:
    host, port = base.removeprefix("http://").rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (host, int(port)))
    await loop.sock_sendall(sock, f"GET /api/event HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    return sock


async def _slow(base: str, told: list[str]) -> None:
    """Reads 1 KiB every 100 ms; records the server.* events it gets."""
    reader, writer = await asyncio.open_connection(*base.removeprefix("http://").rsplit(":", 1))
    writer.write(b"GET /api/event HTTP/1.1\r\nHost: x\r\n\r\n")
    data = b""
    try:
        while chunk := await reader.read(1024):
            data += chunk[-4096:]
            data = data[-8192:]
            told += [m.decode() for m in re.findall(rb"event: (server\.[\w.]+)", chunk)]
            await asyncio.sleep(0.1)
    finally:
        writer.close()


async def _admissions(
    http: aiohttp.ClientSession, sessions: list[str], rate: float, seconds: float
) -> dict[str, float]:
    sent: dict[str, float] = {}
    count = int(rate * seconds)
    start = clock()
    tasks: set[asyncio.Task[None]] = set()

    async def one(i: int) -> None:
        mid = ids.message_id()
        sent[mid] = clock()
        body = {"id": mid, "text": f"p{i}", "resume": False}
        async with http.post(f"/api/session/{sessions[i % len(sessions)]}/prompt", json=body) as r:
            assert r.status == 200, await r.text()

    for i in range(count):
        delay = start + i / rate - clock()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.ensure_future(one(i))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)
    return sent


def _delivery(sent: dict[str, float], subscribers: Sequence[Subscriber]) -> dict[str, Any]:
    latencies: list[float] = []
    missing = 0
    for sub in subscribers:
        for mid, at in sent.items():
            got = sub.seen.get(mid)
            if got is None:
                missing += 1
            else:
                latencies.append((got - at) * 1000)
    return {
        "pairs": len(latencies),
        "missing": missing,
        "p50_ms": round(_pct(latencies, 0.5), 3),
        "p99_ms": round(_pct(latencies, 0.99), 3),
        "max_ms": round(max(latencies, default=math.nan), 3),
    }


async def _settle(subscribers: Sequence[Subscriber], sent: dict[str, float]) -> None:
    """Wait (bounded) until every live subscriber has every prompt."""
    deadline = clock() + 10
    while clock() < deadline:
        if all(sub.ended.is_set() or len(sub.seen) >= len(sent) for sub in subscribers):
            return
        await asyncio.sleep(0.05)


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
        background: set[asyncio.Task[None]] = set()

        def spawn(coro: Any) -> None:
            task = asyncio.ensure_future(coro)
            background.add(task)

        # 1. Baseline: one subscriber.
        _log(args, f"baseline: 1 subscriber, {args.rate:g}/s for {args.seconds:g} s")
        one = Subscriber()
        spawn(one.run(http))
        await asyncio.wait_for(one.connected.wait(), 30)
        sent = await _admissions(http, sessions, args.rate, args.seconds)
        await _settle([one], sent)
        baseline = _delivery(sent, [one])

        # 2. Load: many subscribers (in worker processes: parsing 40,000 frames/s
        # is more than one client process can do), a stuck one and a slow one.
        _log(args, f"load: {args.subscribers} subscribers + a stuck and a slow one")
        ctx = multiprocessing.get_context("spawn")
        ready = ctx.Queue()
        workers = max(1, min(args.workers, args.subscribers))
        shares = [
            args.subscribers // workers + (i < args.subscribers % workers) for i in range(workers)
        ]
        loop = asyncio.get_running_loop()
        with ProcessPoolExecutor(
            workers, mp_context=ctx, initializer=_init_worker, initargs=(ready,)
        ) as pool:
            jobs = [loop.run_in_executor(pool, _worker, server.base, n) for n in shares]
            for _ in shares:
                await loop.run_in_executor(None, ready.get, True, 120)
            stuck = await _stuck(server.base)
            slow_told: list[str] = []
            spawn(_slow(server.base, slow_told))
            sent = await _admissions(http, sessions, args.rate, args.seconds)
            await asyncio.sleep(2)  # the frames in flight land; then the streams end at SIGINT
            # The stuck one: read what it was sent, without blocking the loop.
            stuck_events = await _drain_stuck(stuck, args.write_timeout * 2 + 2)
            stuck.close()

            # 3. SIGINT with every subscriber and a log follower attached.
            follower = Subscriber()
            spawn(follower.run(http, f"/api/experimental/session/{sessions[0]}/log?follow=true"))
            await asyncio.wait_for(follower.connected.wait(), 30)
            _log(args, "SIGINT with followers attached")
            sigint_s = await server.sigint()
            results = [r for rs in await asyncio.wait_for(asyncio.gather(*jobs), 60) for r in rs]
        subs = []
        for r in results:
            sub = Subscriber()
            sub.seen, sub.events = r["seen"], r["events"]
            subs.append(sub)
        load = _delivery(sent, subs)
        dropped = sum(1 for s in subs if "server.connection.dropped" in s.events)
        await asyncio.wait_for(follower.ended.wait(), 30)
        disposed = sum(1 for s in subs if s.events[-1:] == ["server.instance.disposed"])
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
    return {
        "baseline": baseline,
        "load": load,
        "dropped_reading": dropped,
        "stuck_told": stuck_events,
        "slow_told": slow_told,
        "sigint_s": round(sigint_s, 3),
        "disposed": disposed,
        "follower_ended": follower.ended.is_set(),
    }


async def _drain_stuck(sock: socket.socket, within: float) -> list[str]:
    loop = asyncio.get_running_loop()
    data = b""
    with contextlib.suppress(TimeoutError, OSError):
        async with asyncio.timeout(within):
            while chunk := await loop.sock_recv(sock, 1 << 16):
                data = (data + chunk)[-65536:]
    return [m.decode() for m in re.findall(rb"event: (server\.[\w.]+)", data)]


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
    return f"{value:,.0f} {unit}".strip()


def render(report: dict[str, Any]) -> str:
    lines = [
        f"sessionrt feed benchmark: {report['subscribers']} subscribers, {report['rate']:g}"
        f" admissions/s for {report['seconds']:g} s, write timeout {report['write_timeout_s']:g} s,"
        f" aiohttp {report['aiohttp']}, SQLite {report['sqlite_version']},"
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
    lines += [
        "",
        f"  the stuck subscriber was told: {report['stuck_told'][-2:]}",
        f"  the slow subscriber was told: {report['slow_told'][-2:]}",
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
        "--write-timeout", type=float, default=2.0, help="[server] stream_write_timeout_s"
    )
    parser.add_argument("--workers", type=int, default=4, help="client processes for the load")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return report_main(lambda: asyncio.run(run(args)), render, as_json=args.json, hard_limit_s=900)


if __name__ == "__main__":
    sys.exit(main())
