#!/usr/bin/env python3
"""Stalled clients against a real ``sessionrt serve``: do new requests still get answered?

    .venv/bin/python scripts/probe_stalls.py                       # 1,100 + 550 stalled
    .venv/bin/python scripts/probe_stalls.py --bodies 2000 --headers 500 --fd-limit 1024

Starts ``sessionrt serve`` as a subprocess with its soft open-files limit set
to ``--fd-limit`` (1,024 by default, a laptop's usual value; serve raises its
own to the hard limit), times a fresh ``GET /api/session`` (the **baseline**,
same run), then opens ``--bodies`` connections that send a POST whose body
stops short of its Content-Length and ``--headers`` connections whose headers
never end, and times a fresh request again. Finally it waits for the server
to close the stalled ones: the bodies with a 408 after ``body_timeout_s``,
the headers after ``header_timeout_s`` (both from ``[server]``; the probe
passes them with ``--config``). Issue #8 §4: 1,100 stalled requests used to
exhaust the descriptors and hang every new request.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parent.parent
SESSIONRT: Final = ROOT / ".venv" / "bin" / "sessionrt"

BODY: Final = (
    b"POST /api/session HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
)
HEAD: Final = b"GET /api/session HTTP/1.1\r\nHost: 127.0.0.1\r\n"
FRESH: Final = b"GET /api/session HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _fresh(port: int, guard_s: float) -> tuple[float, bytes]:
    start = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(FRESH)
    try:
        async with asyncio.timeout(guard_s):
            answer = await reader.read()
    finally:
        writer.close()
    return (time.perf_counter() - start) * 1000, answer.split(b"\r\n", 1)[0]


async def _stall(port: int, data: bytes, count: int) -> list[Conn]:
    conns = []
    for _ in range(count):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(data)
        conns.append((reader, writer))
    return conns


async def _ended(conns: list[Conn], guard_s: float) -> tuple[int, int]:
    """How many the server closed within ``guard_s``, and how many of those said 408."""

    async def one(conn: Conn) -> bytes | None:
        try:
            async with asyncio.timeout(guard_s):
                return await conn[0].read()
        except TimeoutError:
            return None

    answers = await asyncio.gather(*(one(c) for c in conns))
    for _, writer in conns:
        writer.close()
    closed = [a for a in answers if a is not None]
    return len(closed), sum(a.startswith(b"HTTP/1.1 408") for a in closed)


def _limit(fds: int) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(fds, hard), hard))


async def run(args: argparse.Namespace) -> int:
    # The probe itself holds every stalled connection open.
    _limit(resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "server.toml"
        config.write_text(
            f"[server]\nheader_timeout_s = {args.header_timeout}\n"
            f"body_timeout_s = {args.body_timeout}\n"
        )
        proc = await asyncio.create_subprocess_exec(
            str(SESSIONRT),
            *("serve", "--port", "0", "--data-dir", str(Path(tmp) / "data")),
            *("--config", str(config)),
            stdout=asyncio.subprocess.PIPE,
            preexec_fn=lambda: _limit(args.fd_limit),
        )
        try:
            assert proc.stdout is not None
            line = (await proc.stdout.readline()).decode()
            port = int(line.rsplit(":", 1)[1])
            base_ms, base_status = await _fresh(port, 10)
            bodies = await _stall(port, BODY, args.bodies)
            heads = await _stall(port, HEAD, args.headers)
            stalled = len(bodies) + len(heads)
            try:
                loaded_ms, loaded_status = await _fresh(port, 10)
            except TimeoutError:
                loaded_ms, loaded_status = float("nan"), b"(no answer in 10 s)"
            guard = max(args.header_timeout, args.body_timeout) + 15
            (b_closed, b_408), (h_closed, _) = await asyncio.gather(
                _ended(bodies, guard), _ended(heads, guard)
            )
        finally:
            proc.terminate()
            await proc.wait()
    print(f"sessionrt stalled-client probe: serve started with a soft fd limit of {args.fd_limit}")
    print(f"  fresh request, nothing stalled (baseline): {base_ms:.1f} ms, {base_status.decode()}")
    print(f"  fresh request with {stalled:,} stalled: {loaded_ms:.1f} ms, {loaded_status.decode()}")
    print(f"  short bodies closed by the server: {b_closed:,}/{len(bodies):,} ({b_408:,} with 408)")
    print(f"  unfinished headers closed by the server: {h_closed:,}/{len(heads):,}")
    ok = loaded_status.startswith(b"HTTP/1.1 200") and b_closed == len(bodies)
    ok = ok and h_closed == len(heads)
    print(f"  [{'PASS' if ok else 'FAIL'}] new requests answered; every stalled one closed")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--bodies", type=int, default=1100, help="short-body connections")
    parser.add_argument("--headers", type=int, default=550, help="unfinished-header connections")
    parser.add_argument("--fd-limit", type=int, default=1024, help="serve's soft limit at start")
    parser.add_argument("--header-timeout", type=float, default=5.0, help="[server] seconds")
    parser.add_argument("--body-timeout", type=float, default=5.0, help="[server] seconds")
    return asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
