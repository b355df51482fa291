#!/usr/bin/env python3
"""The cost of one turn as a session's history grows (SQLite, scripted model).

    .venv/bin/python scripts/bench_history.py                 # table
    .venv/bin/python scripts/bench_history.py --json          # one JSON object on stdout
    .venv/bin/python scripts/bench_history.py --messages 2000 --window 10 --quiet

One session on a fresh runtime (``--synchronous``, NORMAL by default: what grows
with history is CPU, and FULL's fsync on a shared disk is noise that hides it; the
scripted model at zero delay, its default one-text-block reply) gets prompts one
after another: ``sessions.prompt(..., resume=False)`` then
``execution.resume(sid)``, so each turn is one busy period with one step and adds
two messages (the user's and the assistant's). A turn's time is measured at each
checkpoint (100, 500, 1,000, 2,000 and 4,000 messages, up to ``--messages``) as
the median of the ``--window`` turns that end there.

The baseline is measured beside each checkpoint: when a checkpoint's window
starts, a new session of the same runtime (same store, same caches) is grown,
untimed, to 100 - 2 x window messages; then each of the window's turns is
followed by one turn of that reference session, so its window ends at 100
messages too. The two take turns within the same second, so a machine whose
speed drifts slows both alike (measured seconds apart, the turn at 4,000 against
the turn at 100 ranged from 1.09x to 2.28x over nine runs of one tree). A turn
whose cost does not grow with history keeps a ratio near 1; the first
checkpoint's ratio (two sessions at 100 messages) shows the method's noise. The
sequential ratio (the same session's turn at 100, measured first) is shown as
context. The same turn on a bare :class:`~storage.SQLiteStore` (the appends
alone, as in bench_runtime) is shown once for scale. At each checkpoint, outside
the timed turns, the active history's read (``queries.context``) and its
conversion (``to_chat`` on a warm cache) are timed on their own: the two parts
of a turn that grow with history.

Target (informational; 2 cores): a turn at 4,000 messages within 1.5x of a turn at
100 timed beside it (issue #15 §5). The exit status is 0 unless the benchmark itself fails.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from _benchlib import report_main, target_lines
from bench_runtime import PROMPT, BaselineSession, RecordingProvider, open_runtime, runtime_step

from actors.runtime import Runtime
from actors.session.history import ChatCache, to_chat
from storage import SQLiteStore

CHECKPOINTS: Final = (100, 500, 1000, 2000, 4000)
TARGET_RATIO: Final = 1.5
READ_REPEATS: Final = 5


def _log(args: argparse.Namespace, message: str) -> None:
    if not args.quiet:
        print(f"[bench_history] {message}", file=sys.stderr, flush=True)


async def _reads(rt: Runtime, sid: str, messages: int) -> dict[str, Any]:
    """Where a turn's history-dependent time goes: the active history's read (SQL and
    the decode cache's look-ups; the SQL round trip timed by wrapping the queries'
    private fetch here) and its conversion to model messages (a warm cache)."""
    read, sql, convert = [], [], []
    cache = ChatCache()
    queries: Any = rt.store.queries  # the SQLite reads (Queries), typed as the protocol
    # Wrapped here only, to split the SQL from the decoding: the history read
    # goes to the reader in one hop (several statements), a plain read in one.
    fetch, fetch_many = queries._fetch, queries._fetch_many

    async def timed(statement: str, params: Sequence[Any]) -> list[Any]:
        start = time.perf_counter()
        try:
            rows: list[Any] = await fetch(statement, params)
            return rows
        finally:
            sql.append(time.perf_counter() - start)

    async def timed_many(statements: Sequence[Any]) -> list[Any]:
        start = time.perf_counter()
        try:
            rows: list[Any] = await fetch_many(statements)
            return rows
        finally:
            sql.append(time.perf_counter() - start)

    for _ in range(READ_REPEATS):
        queries._fetch, queries._fetch_many = timed, timed_many
        sql_before = len(sql)
        start = time.perf_counter()
        try:
            history = await queries.context(sid)
        finally:
            queries._fetch, queries._fetch_many = fetch, fetch_many
        # One read's SQL: the sum of its round trips.
        sql[sql_before:] = [sum(sql[sql_before:])]
        read.append(time.perf_counter() - start)
        start = time.perf_counter()
        to_chat(history, cache)
        convert.append(time.perf_counter() - start)
    return {
        "messages": messages,
        "context_read_ms": round(statistics.median(read) * 1000, 3),
        "context_sql_ms": round(statistics.median(sql) * 1000, 3),
        "to_chat_ms": round(statistics.median(convert[1:]) * 1000, 3),
    }


async def _reference(rt: Runtime, messages: int) -> str:
    """A new session of the same runtime grown to ``messages`` (untimed turns)."""
    sid = (await rt.sessions.create()).id
    for i in range(messages // 2):
        await runtime_step(rt, sid, PROMPT.format(i=i))
    return sid


async def run_all(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    checkpoints = [c for c in CHECKPOINTS if c <= args.messages] or [args.messages]
    provider = RecordingProvider()
    turns: list[tuple[int, float]] = []  # (messages after the turn, seconds)
    # Per checkpoint, the turns of a reference session (at the first checkpoint's
    # length when its window ends), each run right after one of the window's turns.
    beside: dict[int, list[float]] = {}
    reads: list[dict[str, Any]] = []
    lead = checkpoints[0] - 2 * args.window
    async with open_runtime(root, "history", args.synchronous, provider) as rt:
        sid = (await rt.sessions.create()).id
        messages = 0
        reference: str | None = None
        while messages < checkpoints[-1]:
            upcoming = next(c for c in checkpoints if c > messages)
            if upcoming - 2 * args.window <= messages and upcoming not in beside:
                # This checkpoint's window starts: a fresh reference session at
                # ``lead`` messages, whose window then ends at the first checkpoint.
                reference = await _reference(rt, lead)
                beside[upcoming] = []
            elapsed = await runtime_step(rt, sid, PROMPT.format(i=messages // 2))
            messages += 2
            turns.append((messages, elapsed))
            if reference is not None:
                i = lead // 2 + len(beside[upcoming])
                beside[upcoming].append(await runtime_step(rt, reference, PROMPT.format(i=i)))
                if messages == upcoming:
                    reference = None
            if messages in checkpoints:
                reads.append(await _reads(rt, sid, messages))
            if messages % 500 == 0:
                _log(args, f"{messages:,} messages, last turn {elapsed * 1000:.2f} ms")
        request = provider.last[sid]
    async with SQLiteStore(root / "baseline.db", synchronous=args.synchronous) as store:
        base = await BaselineSession.create(store, str(root))
        bare = [(await base.step("bare", request))[0] for _ in range(args.window * 2)]
    points = []
    for c in checkpoints:
        window = [s for n, s in turns if c - 2 * args.window < n <= c]
        points.append(
            {
                "messages": c,
                "turn_ms": round(statistics.median(window) * 1000, 3),
                "reference_turn_ms": round(statistics.median(beside[c]) * 1000, 3),
            }
        )
    return {
        "python": platform.python_version(),
        "sqlite_version": sqlite3.sqlite_version,
        "cpus": os.cpu_count(),
        "window": args.window,
        "synchronous": args.synchronous,
        "reference_messages": checkpoints[0],
        "points": points,
        "reads": reads,
        "bare_store_turn_ms": round(statistics.median(bare) * 1000, 3),
        "request_messages_at_end": len(request.messages),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-history-") as tmp:
        report = asyncio.run(run_all(args, Path(tmp)))
    points = report["points"]
    first, last = points[0], points[-1]
    ref = report["reference_messages"]
    figures = []
    for p in points:
        base = p["reference_turn_ms"]
        ratio = p["turn_ms"] / base if base else None
        figure: dict[str, Any] = {
            "name": f"one turn at {p['messages']:,} messages",
            "value": p["turn_ms"],
            "unit": "ms",
            "baseline": base,
            "baseline_label": f"a turn at {ref:,} messages, timed beside it",
            "ratio": None if ratio is None else round(ratio, 3),
        }
        if p is last and p is not first:
            figure["target"] = f"<= {TARGET_RATIO:g}x"
            figure["pass"] = ratio is not None and ratio <= TARGET_RATIO
        figures.append(figure)
    if last is not first:
        # Context: the same session's own turn at the first checkpoint, measured
        # seconds earlier; a machine whose speed drifts moves this one.
        figures.append(
            {
                "name": f"one turn at {last['messages']:,} messages (sequential)",
                "value": last["turn_ms"],
                "unit": "ms",
                "baseline": first["turn_ms"],
                "baseline_label": f"the same session's turn at {first['messages']:,} messages",
                "ratio": round(last["turn_ms"] / first["turn_ms"], 3) if first["turn_ms"] else None,
            }
        )
    reads = report["reads"]
    for key, label in (("context_read_ms", "queries.context"), ("to_chat_ms", "to_chat")):
        for r in reads[1:]:
            figures.append(
                {
                    "name": f"{label} at {r['messages']:,} messages (outside the turns)",
                    "value": r[key],
                    "unit": "ms",
                    "baseline": reads[0][key],
                    "baseline_label": f"at {reads[0]['messages']:,} messages",
                    "ratio": round(r[key] / reads[0][key], 3) if reads[0][key] else None,
                }
            )
    figures.append(
        {
            "name": "one bare-store turn (same appends, no runtime)",
            "value": report["bare_store_turn_ms"],
            "unit": "ms",
            "baseline": None,
        }
    )
    base = last["reference_turn_ms"]
    ratio = last["turn_ms"] / base if base else float("inf")
    report["figures"] = figures
    report["targets"] = [
        {
            "name": f"turn at {last['messages']:,} messages / turn at {ref:,} beside it"
            f" <= {TARGET_RATIO:g}x",
            "value": round(ratio, 3),
            "unit": "x",
            "pass": ratio <= TARGET_RATIO,
        }
    ]
    return report


def _num(value: Any, unit: str) -> str:
    return f"{value:.3f} {unit}".rstrip() if isinstance(value, float) else f"{value} {unit}"


def render(report: dict[str, Any]) -> str:
    lines = [
        f"bench_history: one session, scripted model, SQLite {report['synchronous']};"
        f" median of {report['window']} turns per checkpoint; Python {report['python']}",
        "",
    ]
    for f in report["figures"]:
        base = ""
        if f.get("baseline") is not None:
            base = f" (baseline {_num(f['baseline'], f['unit'])}, {f['baseline_label']};"
            base += f" {f['ratio']:.2f}x)"
        lines.append(f"  {f['name']}: {_num(f['value'], f['unit'])}{base}")
    lines.append("  where it grows, per read (median of 5, outside the timed turns):")
    for r in report["reads"]:
        lines.append(
            f"    {r['messages']:>6,} messages: queries.context {r['context_read_ms']:.3f} ms"
            f" (its SQL round trip {r['context_sql_ms']:.3f} ms),"
            f" to_chat (warm cache) {r['to_chat_ms']:.3f} ms"
        )
    lines.append(f"  the last request carried {report['request_messages_at_end']:,} model messages")
    lines.append("")
    lines += target_lines(report["targets"], _num, heading="targets (informational):")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--messages",
        type=int,
        default=CHECKPOINTS[-1],
        help="history length to grow to (default: %(default)s)",
    )
    parser.add_argument(
        "--window",
        type=int,
        default=20,
        help="turns per checkpoint whose median is reported (default: %(default)s)",
    )
    parser.add_argument(
        "--synchronous",
        choices=("NORMAL", "FULL"),
        default="NORMAL",
        help="SQLite synchronous mode of both stores (default: %(default)s)",
    )
    parser.add_argument(
        "--dir", default=None, help="where the temp data dir goes (default: the system temp dir)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)
    if args.messages < 2 or args.window < 1 or 2 * args.window > min(args.messages, 100):
        parser.error("--messages must be at least 2 and --window at most 50 and messages/2")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return report_main(lambda: run(args), render, as_json=args.json, hard_limit_s=1800)


if __name__ == "__main__":
    sys.exit(main())
