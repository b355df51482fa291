#!/usr/bin/env python3
"""What a tool call costs as a child actor, and how fast an interrupt settles every child.

    .venv/bin/python scripts/bench_tools.py            # table
    .venv/bin/python scripts/bench_tools.py --json     # one JSON object on stdout
    .venv/bin/python scripts/bench_tools.py --calls 2000 --concurrency 16

One process, one loop, real pykka threads, real files (and, for the bash
figure, real subprocesses). Each figure alternates rounds with its baseline
in the same run, so both see the same machine and load:

1. **Calls/s.** A trivial tool (returns its input as text; bounding marks it
   not truncated) through :class:`~actors.tools.ToolExecutor`: validation,
   the call handed to an idle pooled :class:`~actors.tools.ToolCallActor`'s
   worker, its outcome posted to the loop, owner bookkeeping. Baseline: the same tool
   run and bounding through a plain bounded pool
   (:class:`~actors.BlockingExecutor`, the same thread limit). Sequential
   (one call at a time) and ``--concurrency`` calls in flight.
2. **Interrupt → every child settled.** ``--children`` calls of a cooperative
   tool (it waits on ``ctx.cancel``, as long tools poll it) are running under
   one :class:`~actors.tools.ToolOwner`; the clock starts when the interrupt
   lands (every call task cancelled, ``owner.stop()``) and stops when every
   call has its outcome and every child has reported. Target: at most 100 ms.
   The same with real bash children (``sleep 30``: the cancel wakes the
   tool's selector, it kills the process group, reaps it) is shown
   without a target, as is the plain-pool baseline of the cooperative case.
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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from _benchlib import report_main, target_lines

from actors import BlockingExecutor
from actors.tools import (
    OutputBounding,
    ToolActors,
    ToolContext,
    ToolError,
    ToolExecutor,
    ToolOutcome,
    ToolOwner,
    ToolRegistry,
    ToolResult,
)
from actors.tools.builtin import BashTool

TARGET_SETTLE_MS = 100.0
GUARD_S = 30.0


class Echo:
    name = "echo"
    description = "returns its input"
    input_schema: Mapping[str, Any] = {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "additionalProperties": False,
    }

    def run(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        return ToolResult.text(str(input.get("text", "")))


class Waits:
    """Cooperative: blocks until its call is cancelled, as long tools poll ``ctx.cancel``."""

    name = "waits"
    description = "waits for its cancel"
    input_schema: Mapping[str, Any] = {"type": "object"}

    def __init__(self, loop: asyncio.AbstractEventLoop, started: asyncio.Queue[str]) -> None:
        self._loop = loop
        self._started = started

    def run(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        self._loop.call_soon_threadsafe(self._started.put_nowait, ctx.call_id)
        if not ctx.cancel.wait(GUARD_S):
            return ToolResult.text("never cancelled")
        raise ToolError("interrupted", type="aborted")


def _ctx(directory: Path, output_dir: Path, n: int) -> ToolContext:
    return ToolContext(
        session_id="ses_bench",
        call_id=f"call_{n}",
        assistant_message_id="msg_bench",
        directory=directory,
        output_dir=output_dir,
    )


async def _calls_per_s(
    calls: int,
    concurrency: int,
    run_one: Any,
) -> float:
    gate = asyncio.Semaphore(concurrency)

    async def one(n: int) -> None:
        async with gate:
            outcome = await run_one(n)
            assert outcome.status == "success", outcome

    start = time.perf_counter()
    await asyncio.gather(*(one(n) for n in range(calls)))
    return calls / (time.perf_counter() - start)


async def _settle_ms(
    children: int, start_call: Any, stop: Any, started: asyncio.Queue[str]
) -> float:
    tasks = [asyncio.create_task(start_call(n)) for n in range(children)]
    async with asyncio.timeout(GUARD_S):
        for _ in range(children):
            await started.get()
    t = time.perf_counter()
    for task in tasks:
        task.cancel()
    await stop()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    elapsed = (time.perf_counter() - t) * 1000
    for r in results:
        assert isinstance(r, ToolOutcome | asyncio.CancelledError), r
    return elapsed


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    with tempfile.TemporaryDirectory(prefix="bench_tools-") as tmp:
        base = Path(tmp)
        directory, output_dir = base / "project", base / "tool-output"
        directory.mkdir()
        bounding = OutputBounding(output_dir=output_dir)
        started: asyncio.Queue[str] = asyncio.Queue()
        echo, waits = Echo(), Waits(loop, started)
        bash = BashTool(kill_grace_s=0.5)
        registry = ToolRegistry([echo, waits, bash])
        async with (
            BlockingExecutor(limit=args.threads) as plain,
            ToolActors(blocking=plain, limit=args.threads) as actors,
        ):
            executor = ToolExecutor(registry, actors, bounding)

            def plain_work(ctx: ToolContext) -> ToolOutcome:
                result = echo.run({"text": "hello"}, ctx)
                return ToolOutcome.success(bounding.bound(result))

            async def via_actor(n: int) -> ToolOutcome:
                ctx = _ctx(directory, output_dir, n)
                return await executor.execute("echo", {"text": "hello"}, ctx, owner=owner)

            async def via_plain(n: int) -> ToolOutcome:
                ctx = _ctx(directory, output_dir, n)
                problem = registry.validate("echo", {"text": "hello"})
                assert problem is None
                return await plain.run(plain_work, ctx, cancel=ctx.cancel)

            owner = ToolOwner()
            # Warm up both paths (threads of the plain pool, imports, caches).
            await _calls_per_s(200, args.concurrency, via_actor)
            await _calls_per_s(200, args.concurrency, via_plain)
            rates: dict[str, list[float]] = {k: [] for k in ("a1", "p1", "ac", "pc")}
            for _ in range(args.rounds):
                rates["a1"].append(await _calls_per_s(args.calls, 1, via_actor))
                rates["p1"].append(await _calls_per_s(args.calls, 1, via_plain))
                rates["ac"].append(await _calls_per_s(args.calls, args.concurrency, via_actor))
                rates["pc"].append(await _calls_per_s(args.calls, args.concurrency, via_plain))

            # Interrupt -> every child settled.
            settle: dict[str, list[float]] = {"actor": [], "plain": [], "bash": []}
            for _ in range(args.rounds):
                step = ToolOwner()

                async def child(n: int, step: ToolOwner = step) -> ToolOutcome:
                    ctx = _ctx(directory, output_dir, n)
                    return await executor.execute("waits", {}, ctx, owner=step)

                settle["actor"].append(await _settle_ms(args.children, child, step.stop, started))

                async def plain_child(n: int) -> ToolOutcome:
                    ctx = _ctx(directory, output_dir, n)
                    try:
                        result = await plain.run(waits.run, {}, ctx, cancel=ctx.cancel)
                    except ToolError as exc:
                        return ToolOutcome.from_error(exc)
                    return ToolOutcome.success(result)

                async def nothing() -> None:
                    return None

                settle["plain"].append(
                    await _settle_ms(args.children, plain_child, nothing, started)
                )

            bash_children = min(args.children, args.threads)
            for _ in range(max(1, args.rounds // 2)):
                seen: set[str] = set()

                def first_progress(p: Any, seen: set[str] = seen) -> None:
                    if p.call_id not in seen and "up" in str(p.metadata.get("output", "")):
                        seen.add(p.call_id)
                        started.put_nowait(p.call_id)

                step = ToolOwner(on_progress=first_progress)

                async def bash_child(n: int, step: ToolOwner = step) -> ToolOutcome:
                    ctx = _ctx(directory, output_dir, n)
                    command = {"command": "echo up; sleep 30", "timeout_s": 60}
                    return await executor.execute("bash", command, ctx, owner=step)

                settle["bash"].append(
                    await _settle_ms(bash_children, bash_child, step.stop, started)
                )
            assert actors.running == 0

    def med(xs: list[float]) -> float:
        return round(statistics.median(xs), 1)

    def worst(xs: list[float]) -> float:
        return round(max(xs), 1)

    settle_max = worst(settle["actor"])
    figures = [
        _figure("tool calls/s, sequential (child actors)", med(rates["a1"]), med(rates["p1"])),
        _figure(
            f"tool calls/s, {args.concurrency} in flight (child actors)",
            med(rates["ac"]),
            med(rates["pc"]),
        ),
        _figure(
            f"interrupt -> {args.children} cooperative children settled, median",
            med(settle["actor"]),
            med(settle["plain"]),
            unit="ms",
        ),
        _figure(
            f"interrupt -> {args.children} cooperative children settled, worst of {args.rounds}",
            settle_max,
            worst(settle["plain"]),
            unit="ms",
            target=f"<= {TARGET_SETTLE_MS:g} ms",
            passed=settle_max <= TARGET_SETTLE_MS,
        ),
        _figure(
            f"interrupt -> {bash_children} bash children (sleep 30) killed and settled, median",
            med(settle["bash"]),
            None,
            unit="ms",
        ),
    ]
    return {
        "python": platform.python_version(),
        "sqlite_version": sqlite3.sqlite_version,
        "cpus": os.cpu_count(),
        "calls": args.calls,
        "rounds": args.rounds,
        "threads": args.threads,
        "per_call_us": {
            "actor_sequential": round(1e6 / med(rates["a1"]), 1),
            "plain_sequential": round(1e6 / med(rates["p1"]), 1),
        },
        "figures": figures,
        "targets": [
            {
                "name": f"interrupt -> every cooperative child settled <= {TARGET_SETTLE_MS:g} ms",
                "value": settle_max,
                "unit": "ms",
                "pass": settle_max <= TARGET_SETTLE_MS,
            }
        ],
    }


def _figure(
    name: str,
    value: float,
    baseline: float | None,
    *,
    unit: str = "/s",
    target: str | None = None,
    passed: bool | None = None,
) -> dict[str, Any]:
    return {
        "name": name,
        "value": value,
        "unit": unit,
        "baseline": baseline,
        "baseline_label": "plain bounded pool",
        "ratio": round(value / baseline, 2) if baseline else None,
        "target": target,
        "pass": passed,
    }


def _num(value: float, unit: str) -> str:
    return f"{value:,.1f} {unit}"


def render(report: dict[str, Any]) -> str:
    lines = [
        f"sessionrt tool-call benchmark: {report['calls']} calls x {report['rounds']} rounds,"
        f" {report['threads']} threads, Python {report['python']}, {report['cpus']} CPUs",
        "",
    ]
    for f in report["figures"]:
        base = "" if f["baseline"] is None else f" (baseline {_num(f['baseline'], f['unit'])},"
        base += "" if f["baseline"] is None else f" {f['baseline_label']}; {f['ratio']:.2f}x)"
        lines.append(f"  {f['name']}: {_num(f['value'], f['unit'])}{base}")
    per = report["per_call_us"]
    lines.append(
        f"  per call, sequential: {per['actor_sequential']} µs as a child actor,"
        f" {per['plain_sequential']} µs on the plain pool"
    )
    lines.append("")
    lines += target_lines(report["targets"], _num, heading="targets (informational):")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=1000, help="calls per rate round")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--children", type=int, default=16, help="children per interrupt round")
    parser.add_argument("--threads", type=int, default=16, help="the pools' thread limit")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return report_main(
        lambda: asyncio.run(measure(args)), render, as_json=args.json, hard_limit_s=600
    )


if __name__ == "__main__":
    sys.exit(main())
