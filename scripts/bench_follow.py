#!/usr/bin/env python3
"""Commit cost with N session-log followers on N sessions: the dispatcher next to the old fan-out.

    .venv/bin/python scripts/bench_follow.py                 # table
    .venv/bin/python scripts/bench_follow.py --json          # one JSON object on stdout
    .venv/bin/python scripts/bench_follow.py --followers 10 100 1000 --batches 200

For each follower count N, on a fresh temp SQLite store (``--synchronous``,
NORMAL by default so the fan-out is not hidden under an fsync), N sessions are
created and N follows opened (``follow=True``), one per session. Then
``--batches`` times, ``--batch`` commands (one ``SessionRenamed`` each, on
sessions taken round-robin) are submitted together and awaited: one commit
batch each. Timed: the whole append phase (commands/s) and, by wrapping the
store's private ``_publish`` in this script, the fan-out of each committed
batch to the subscribers (µs per batch). Three variants, same run, same data:

* ``none``: no follower (the floor);
* ``per-follow`` (the baseline, the code before the dispatcher): every follow
  subscribes to the store and scans every committed batch for its session;
* ``dispatcher``: :class:`storage.FollowDispatcher`, one subscription, rings
  the follows of the batch's sessions only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from _benchlib import report_main, target_lines

from protocol import Location
from protocol import events as ev
from storage import Command, FollowDispatcher, RecordedEvent, SQLiteStore


def _legacy_ring(session_id: str, bell: asyncio.Event) -> Callable[[Sequence[RecordedEvent]], None]:
    def ring(records: Sequence[RecordedEvent]) -> None:
        if any(r.aggregate_id == session_id for r in records):
            bell.set()

    return ring


async def _run(variant: str, n: int, batches: int, batch: int, synchronous: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteStore(Path(tmp) / "bench.sqlite", synchronous=synchronous)  # type: ignore[arg-type]
        async with store:
            sessions = [f"ses_{i:06d}" for i in range(n)]
            loc = Location(directory="/")
            await asyncio.gather(
                *(
                    store.submit(
                        Command.of(ev.SessionCreated(session_id=s, title="t", location=loc))
                    )
                    for s in sessions
                )
            )
            fanout: list[float] = []
            publish = store._publish

            def timed(records: Sequence[RecordedEvent]) -> None:
                started = time.perf_counter()
                publish(records)
                fanout.append(time.perf_counter() - started)

            store._publish = timed  # type: ignore[method-assign]
            async with contextlib.AsyncExitStack() as stack:
                if variant == "per-follow":
                    for s in sessions:
                        stack.callback(store.subscribe(_legacy_ring(s, asyncio.Event())))
                elif variant == "dispatcher":
                    follows = FollowDispatcher(store)
                    for s in sessions:
                        await stack.enter_async_context(follows.follow(s, follow=True))
                fanout.clear()
                started = time.perf_counter()
                k = 0
                for _ in range(batches):
                    futures = []
                    for _ in range(batch):
                        event = ev.SessionRenamed(session_id=sessions[k % n], title=str(k))
                        futures.append(store.submit(Command.of(event)))
                        k += 1
                    await asyncio.gather(*futures)
                elapsed = time.perf_counter() - started
    return {
        "variant": variant,
        "followers": n if variant != "none" else 0,
        "commands_per_s": round(batches * batch / elapsed),
        "fanout_us_per_batch_p50": round(statistics.median(fanout) * 1e6, 1),
        "fanout_us_per_batch_mean": round(statistics.fmean(fanout) * 1e6, 1),
        "batches": len(fanout),
    }


def produce(args: argparse.Namespace) -> dict[str, Any]:
    rows = []
    for n in args.followers:
        for variant in ("none", "per-follow", "dispatcher"):
            print(f"followers={n} {variant} …", file=sys.stderr, flush=True)
            rows.append(asyncio.run(_run(variant, n, args.batches, args.batch, args.synchronous)))
    by = {(r["variant"], r["followers"]): r for r in rows}
    biggest = max(args.followers)
    new, old = by[("dispatcher", biggest)], by[("per-follow", biggest)]
    targets = [
        {
            "name": f"fan-out per batch with {biggest} followers, dispatcher / per-follow (< 0.1)",
            "value": round(new["fanout_us_per_batch_p50"] / old["fanout_us_per_batch_p50"], 4),
            "unit": "ratio",
            "pass": new["fanout_us_per_batch_p50"] < 0.1 * old["fanout_us_per_batch_p50"],
        }
    ]
    return {"rows": rows, "batch": args.batch, "synchronous": args.synchronous, "targets": targets}


def render(report: dict[str, Any]) -> str:
    lines = [
        f"commit batches of {report['batch']} commands, synchronous={report['synchronous']}",
        f"{'variant':<12}{'followers':>10}{'commands/s':>12}{'fan-out p50 µs':>16}{'mean µs':>10}",
    ]
    for r in report["rows"]:
        lines.append(
            f"{r['variant']:<12}{r['followers']:>10}{r['commands_per_s']:>12}"
            f"{r['fanout_us_per_batch_p50']:>16}{r['fanout_us_per_batch_mean']:>10}"
        )
    lines += target_lines(report["targets"], lambda v, u: f"{v} {u}", heading="targets:")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--followers", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--synchronous", choices=["FULL", "NORMAL"], default="NORMAL")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    return report_main(lambda: produce(args), render, as_json=args.json, hard_limit_s=600)


if __name__ == "__main__":
    raise SystemExit(main())
