#!/usr/bin/env python3
"""Startup recovery: time from spawning ``sessionrt serve`` to every claimed session resumed.

    .venv/bin/python scripts/bench_recovery.py                 # table, 1,000 claimed sessions
    .venv/bin/python scripts/bench_recovery.py --json          # one JSON object on stdout
    .venv/bin/python scripts/bench_recovery.py --sessions 200 --repeat 1 --quiet

Preparation (not timed): a data dir is filled in-process by a
``Runtime(RuntimeConfig(recover=False))``: ``--sessions`` sessions, each with one pending
prompt (``resume=False``) and left *claimed* by appending ``session.execution.started``
through ``runtime.store.append(Command.of(ExecutionStarted(...)))``, as a process that
died mid-execution leaves them. A second data dir holds the same sessions unclaimed.

Each timed run copies a prepared dir, spawns ``sessionrt serve --port 0 --data-dir D``
(the console script next to ``sys.executable``; ``synchronous=FULL``, the default) and
measures from the spawn:

(a) **listening**: until the ``sessionrt listening on`` line is read from its stdout. The
    startup sweep runs inside app start-up, before the server binds: by then every claimed
    session has a durable ``session.execution.recovering`` and its restart notice
    admitted, and has been woken.
(b) **resumed**: until the last claimed session's ``session.execution.started`` following
    its ``session.execution.recovering``, i.e. its execution is running again.
(c) **settled**: until the last of those executions' terminal event released its claim.

(b) and (c) come from the events' ``created`` timestamps (epoch ms, the same clock as the
spawn time taken here), read after the run; while the server works, this script only
polls ``SELECT count(*) FROM session WHERE time_claimed IS NOT NULL`` on a read-only
connection every 100 ms until it reaches 0, so the measurement itself adds little load.
The resumed executions run the scripted model's default reply (one short step each).

Baselines in the same run, measure (a) only: an empty data dir (the server creates the
database), and the same sessions with no claim (the sweep finds nothing). Every figure
is the median of ``--repeat`` runs (all values are in the JSON).

Target (informational; 2 cores): every claimed session resumed (b) <= 2 s. The exit
status is 0 unless the benchmark itself fails (a server that does not start, or sessions
that never resume within ``--timeout``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from _benchlib import target_lines

from actors.runtime import DB_NAME, Runtime, RuntimeConfig
from protocol import events as ev
from protocol.requests import CreateSessionInput, PromptInput
from storage import Command

TARGET_RESUMED_S: Final = 2.0
POLL_S: Final = 0.1


# -- preparation -------------------------------------------------------------------------------


async def prepare(data_dir: Path, workdir: Path, sessions: int, *, claimed: bool) -> None:
    config = RuntimeConfig(
        data_dir=data_dir,
        default_directory=str(workdir),
        synchronous="NORMAL",  # preparation only; the timed server runs at FULL
        recover=False,
    )
    async with Runtime(config) as rt:

        async def one(i: int) -> None:
            s = await rt.sessions.create(CreateSessionInput(title=f"bench_recovery {i}"))
            await rt.sessions.prompt(s.id, PromptInput(text=f"work {i}", resume=False))
            if claimed:
                await rt.store.append(Command.of(ev.ExecutionStarted(session_id=s.id)))

        for start in range(0, sessions, 100):
            await asyncio.gather(*(one(i) for i in range(start, min(sessions, start + 100))))


# -- one timed server start --------------------------------------------------------------------


class Spawned:
    """``sessionrt serve`` on a data dir; a thread reads stdout for the listening line."""

    def __init__(self, exe: Path, data_dir: Path, cwd: Path) -> None:
        env = {k: v for k, v in os.environ.items() if k != "SESSIONRT_SERVER_PASSWORD"}
        self.listening_s: float | None = None
        self._listening = threading.Event()
        self._log = (cwd / "server.log").open("w+b")  # closed by stop()
        self.spawn_ms = int(time.time() * 1000)
        self._t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            [str(exe), "serve", "--port", "0", "--data-dir", str(data_dir)],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._log,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            if self.listening_s is None and b" listening on " in raw:
                self.listening_s = time.perf_counter() - self._t0
                self._listening.set()
        self._listening.set()

    def wait_listening(self, timeout: float) -> float:
        self._listening.wait(timeout)
        if self.listening_s is None:
            self.stop()
            raise RuntimeError(f"the server did not start within {timeout:g} s:\n{self.stderr()}")
        return self.listening_s

    def stderr(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._reader.join(5)
        self._log.close()


def _claims(db: Path) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, isolation_level=None)
    try:
        return int(
            conn.execute("SELECT count(*) FROM session WHERE time_claimed IS NOT NULL").fetchone()[
                0
            ]
        )
    finally:
        conn.close()


def _timeline(db: Path, spawn_ms: int) -> dict[str, Any]:
    """From the log: per session, started after recovering, and the releasing terminal."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, isolation_level=None)
    try:
        rows = conn.execute(
            "SELECT aggregate_id, type, created FROM event"
            " WHERE created >= ? AND type LIKE 'session.execution.%' ORDER BY position",
            (spawn_ms,),
        ).fetchall()
    finally:
        conn.close()
    recovering: set[str] = set()
    resumed: dict[str, int] = {}
    settled: dict[str, int] = {}
    for session, type_, created in rows:
        kind = type_.rsplit(".", 1)[0]
        if kind == "session.execution.recovering":
            recovering.add(session)
        elif session in recovering and kind == "session.execution.started":
            resumed.setdefault(session, created)
        elif session in resumed and kind in (
            "session.execution.succeeded",
            "session.execution.failed",
            "session.execution.interrupted",
        ):
            settled.setdefault(session, created)
    return {
        "recovered": len(recovering),
        "resumed": len(resumed),
        "settled": len(settled),
        "resumed_s": (max(resumed.values()) - spawn_ms) / 1000 if resumed else None,
        "settled_s": (max(settled.values()) - spawn_ms) / 1000 if settled else None,
    }


def timed_start(
    exe: Path, prepared: Path, scratch: Path, *, claimed: int, timeout: float
) -> dict[str, Any]:
    run_dir = scratch / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    if prepared.exists():
        shutil.copytree(prepared, run_dir)
    else:
        run_dir.mkdir()
    server = Spawned(exe, run_dir, scratch)
    try:
        listening = server.wait_listening(timeout)
        if claimed:
            deadline = time.monotonic() + timeout
            while _claims(run_dir / DB_NAME) and time.monotonic() < deadline:
                time.sleep(POLL_S)
    finally:
        server.stop()
    result: dict[str, Any] = {"listening_s": listening}
    if claimed:
        result |= _timeline(run_dir / DB_NAME, server.spawn_ms)
        if result["resumed"] < claimed:
            raise RuntimeError(
                f"only {result['resumed']} of {claimed} claimed sessions resumed within "
                f"{timeout:g} s:\n{server.stderr()}"
            )
    shutil.rmtree(run_dir, ignore_errors=True)
    return result


# -- driver ------------------------------------------------------------------------------------


def _log(args: argparse.Namespace, message: str) -> None:
    if not args.quiet:
        print(message, file=sys.stderr, flush=True)


def _summary(values: Sequence[float | None]) -> dict[str, Any]:
    known = [v for v in values if v is not None]
    return {
        "median_s": round(statistics.median(known), 4) if known else None,
        "min_s": round(min(known), 4) if known else None,
        "max_s": round(max(known), 4) if known else None,
        "runs_s": [None if v is None else round(v, 4) for v in values],
    }


def run(args: argparse.Namespace, exe: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench_recovery-", dir=args.dir) as directory:
        scratch = Path(directory)
        claimed_dir = scratch / "claimed"
        unclaimed_dir = scratch / "unclaimed"
        _log(args, f"preparing {args.sessions:,} claimed sessions ...")
        asyncio.run(prepare(claimed_dir, scratch, args.sessions, claimed=True))
        _log(args, f"preparing {args.sessions:,} unclaimed sessions ...")
        asyncio.run(prepare(unclaimed_dir, scratch, args.sessions, claimed=False))
        empty: list[dict[str, Any]] = []
        unclaimed: list[dict[str, Any]] = []
        claimed: list[dict[str, Any]] = []
        for i in range(args.repeat):
            # Interleaved, so every kind of start sees the same machine weather.
            empty.append(
                timed_start(exe, scratch / "none", scratch, claimed=0, timeout=args.timeout)
            )
            unclaimed.append(
                timed_start(exe, unclaimed_dir, scratch, claimed=0, timeout=args.timeout)
            )
            claimed.append(
                timed_start(exe, claimed_dir, scratch, claimed=args.sessions, timeout=args.timeout)
            )
            c = claimed[-1]
            _log(
                args,
                f"  run {i + 1}: empty {empty[-1]['listening_s']:.3f} s, unclaimed "
                f"{unclaimed[-1]['listening_s']:.3f} s; claimed: listening "
                f"{c['listening_s']:.3f} s, resumed {c['resumed_s']:.3f} s, "
                f"settled {c['settled_s'] or float('nan'):.3f} s",
            )
    rows = [
        {
            "start": "empty data dir (baseline)",
            "claimed": 0,
            "figure": "spawn -> listening",
            **_summary([r["listening_s"] for r in empty]),
        },
        {
            "start": f"{args.sessions:,} sessions, none claimed (baseline)",
            "claimed": 0,
            "figure": "spawn -> listening",
            **_summary([r["listening_s"] for r in unclaimed]),
        },
        {
            "start": f"{args.sessions:,} claimed sessions",
            "claimed": args.sessions,
            "figure": "spawn -> listening (sweep done, notices admitted)",
            **_summary([r["listening_s"] for r in claimed]),
        },
        {
            "start": f"{args.sessions:,} claimed sessions",
            "claimed": args.sessions,
            "figure": "spawn -> every session resumed (execution.started)",
            **_summary([r["resumed_s"] for r in claimed]),
        },
        {
            "start": f"{args.sessions:,} claimed sessions",
            "claimed": args.sessions,
            "figure": "spawn -> every claim released (execution settled)",
            **_summary([r["settled_s"] for r in claimed]),
        },
    ]
    resumed = rows[3]["median_s"]
    targets = [
        {
            "name": f"every one of {args.sessions:,} claimed sessions resumed "
            f"<= {TARGET_RESUMED_S:g} s from spawn (median, 2 cores)",
            "value": resumed,
            "unit": "s",
            "pass": None if resumed is None else resumed <= TARGET_RESUMED_S,
        }
    ]
    return {
        "benchmark": "recovery",
        "sessions": args.sessions,
        "repeat": args.repeat,
        "synchronous": "FULL",
        "python": platform.python_version(),
        "sqlite_version": sqlite3.sqlite_version,
        "cpus": os.cpu_count(),
        "rows": rows,
        "runs": {"empty": empty, "unclaimed": unclaimed, "claimed": claimed},
        "targets": targets,
    }


def render(report: dict[str, Any]) -> str:
    headers = ("start", "figure", "median", "min", "max")

    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f} s"

    table = [
        (r["start"], r["figure"], seconds(r["median_s"]), seconds(r["min_s"]), seconds(r["max_s"]))
        for r in report["rows"]
    ]
    widths = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(headers)]
    lines = [
        f"sessionrt startup recovery benchmark: {report['sessions']:,} claimed sessions, "
        f"median of {report['repeat']}, synchronous={report['synchronous']}, "
        f"SQLite {report['sqlite_version']}, Python {report['python']}, {report['cpus']} CPUs",
        "",
        " | ".join(
            h.ljust(w) if i < 2 else h.rjust(w)
            for i, (h, w) in enumerate(zip(headers, widths, strict=True))
        ),
        "-+-".join("-" * w for w in widths),
    ]
    lines += [
        " | ".join(
            c.ljust(w) if i < 2 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in table
    ]
    base = report["rows"][0]["median_s"]
    claimed = report["rows"][3]["median_s"]
    if base is not None and claimed is not None:
        lines.append("")
        lines.append(
            f"recovery cost over an empty start: {claimed - base:+.3f} s "
            f"({(claimed - base) / report['sessions'] * 1000:.2f} ms per claimed session)"
        )
    lines.append("")
    lines += target_lines(
        report["targets"],
        lambda value, unit: "n/a" if value is None else f"{value:.3f} {unit}",
        heading="targets (informational, 2 cores):",
    )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--sessions", type=int, default=1000, help="claimed sessions (default: %(default)s)"
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="timed starts of each kind (default: %(default)s)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds a start may take to listen, and then to resume everything"
        " (default: %(default)s)",
    )
    parser.add_argument(
        "--dir", default=None, help="where temp data dirs go (default: the system temp dir)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)
    if args.sessions < 1 or args.repeat < 1 or args.timeout <= 0:
        parser.error("--sessions, --repeat and --timeout must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    exe = Path(sys.executable).parent / "sessionrt"
    if not exe.exists():
        print(f"bench_recovery: no sessionrt console script next to {sys.executable}")
        return 2
    with contextlib.suppress(BrokenPipeError):
        report = run(args, exe)
        print(json.dumps(report, indent=2) if args.json else render(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
