#!/usr/bin/env python3
"""How fast a Cancel ends a running tool call, and what a call costs, against an older tree.

    .venv/bin/python scripts/bench_tool_cancel.py                  # against main
    .venv/bin/python scripts/bench_tool_cancel.py --baseline-ref 55851ac --json
    .venv/bin/python scripts/bench_tool_cancel.py --rounds 4 --samples 25

Each figure is measured in this tree and in ``--baseline-ref`` (extracted with
``git archive`` into a temporary directory), in the same run: rounds alternate
between the two trees, each round a fresh subprocess of .venv's Python with
its tree first on ``PYTHONPATH``, so both see the same machine and load.

1. **Cancel → bash ``sleep 30`` ended.** A real bash call under a
   :class:`~actors.tools.ToolOwner` prints ``up`` and sleeps; a random 0-60 ms
   after ``up`` arrives (so the cancel lands at any phase of a poll), the
   clock starts, ``owner.stop()`` is awaited and the clock stops: the call
   has its outcome, so the tool has killed the process group and reaped it.
   Target: p99 at most 50 ms.
2. **Cancel → grep's file loop ended.** The built-in grep over a generated
   tree (``--files`` files of 200 lines, several seconds of work); a random
   100-300 ms after the call starts, the same clock around ``owner.stop()``.
   Target: p99 at most 50 ms.
3. **Per call, a trivial tool.** ``--calls`` sequential calls of a tool that
   returns its input, through :class:`~actors.tools.ToolExecutor`, in µs per
   call (the median of the rounds).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from _benchlib import percentile, report_main, target_lines

ROOT = Path(__file__).resolve().parent.parent
TARGET_P99_MS = 50.0
GUARD_S = 30.0


# -- inner: one tree, one subprocess -------------------------------------------------------------


async def _inner(args: argparse.Namespace) -> dict[str, Any]:
    import inspect

    import actors
    from actors import BlockingExecutor
    from actors.tools import (
        OutputBounding,
        Progress,
        ToolActors,
        ToolContext,
        ToolExecutor,
        ToolOutcome,
        ToolOwner,
        ToolRegistry,
        ToolResult,
    )
    from actors.tools.builtin import BashTool, GrepTool

    class Echo:
        name = "echo"
        description = "returns its input"
        input_schema: Mapping[str, Any] = {"type": "object"}

        def run(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
            return ToolResult.text(str(input.get("text", "")))

    work = Path(tempfile.mkdtemp(prefix="bench-tool-cancel-"))
    tree = Path(args.tree)
    samples: dict[str, list[float]] = {"bash": [], "grep": [], "call_us": []}
    finished_early = 0

    def ctx(directory: Path, n: int) -> ToolContext:
        return ToolContext(
            session_id="ses_bench",
            call_id=f"call_{n}",
            assistant_message_id="msg_bench",
            directory=directory,
            output_dir=work / "out",
        )

    async with BlockingExecutor(limit=4) as blocking:
        # The only switch between the two shapes, and only here: the newer pool
        # joins its spawner's thread on the blocking executor.
        options: dict[str, Any] = {"limit": 8}
        if "blocking" in inspect.signature(ToolActors).parameters:
            options["blocking"] = blocking
        async with ToolActors(**options) as pool:
            bounding = OutputBounding(output_dir=work / "out")
            registry = ToolRegistry([Echo(), BashTool(), GrepTool()])
            executor = ToolExecutor(registry, pool, bounding)

            # 3. per call
            for _ in range(3):  # warm-up
                await executor.execute("echo", {"text": "hi"}, ctx(work, 0))
            start = time.perf_counter()
            for n in range(args.calls):
                await executor.execute("echo", {"text": "hi"}, ctx(work, n))
            samples["call_us"].append((time.perf_counter() - start) / args.calls * 1e6)

            # 1. bash sleep 30
            for n in range(args.samples):
                up = asyncio.Event()

                def on_progress(message: Progress, up: asyncio.Event = up) -> None:
                    if "up" in message.metadata.get("output", ""):
                        up.set()

                owner = ToolOwner(on_progress=on_progress)
                call = asyncio.create_task(
                    executor.execute(
                        "bash", {"command": "echo up; sleep 30"}, ctx(work, n), owner=owner
                    )
                )
                async with asyncio.timeout(GUARD_S):
                    await up.wait()
                await asyncio.sleep(random.uniform(0, 0.06))
                t0 = time.perf_counter()
                await owner.stop()
                samples["bash"].append((time.perf_counter() - t0) * 1000)
                outcome: ToolOutcome = await call
                assert outcome.error is not None, outcome
                assert outcome.error["type"] == "aborted", outcome

            # 2. grep over a large tree
            for n in range(args.samples):
                owner = ToolOwner()
                call = asyncio.create_task(
                    executor.execute(
                        "grep", {"pattern": "no such needle [0-9]+"}, ctx(tree, n), owner=owner
                    )
                )
                await asyncio.sleep(random.uniform(0.1, 0.3))
                t0 = time.perf_counter()
                await owner.stop()
                samples["grep"].append((time.perf_counter() - t0) * 1000)
                outcome = await call
                if outcome.status == "success":
                    finished_early += 1
    return {
        "actors": str(Path(actors.__file__).parent.parent),
        "samples": samples,
        "grep_finished_before_cancel": finished_early,
    }


# -- outer: both trees, alternating ----------------------------------------------------------------


def _log(args: argparse.Namespace, text: str) -> None:
    if not args.quiet:
        print(text, file=sys.stderr, flush=True)


def _make_tree(root: Path, files: int) -> None:
    lines = "".join(f"line {i} of some ordinary text that does not match\n" for i in range(200))
    for n in range(files):
        directory = root / f"d{n // 100:03d}"
        directory.mkdir(exist_ok=True)
        (directory / f"f{n:05d}.txt").write_text(lines)


def _baseline_tree(ref: str, into: Path) -> str:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", ref], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit], cwd=ROOT, check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return commit


def _run_inner(tree: Path, args: argparse.Namespace, data: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    argv = [sys.executable, str(Path(__file__).resolve()), "--inner", "--tree", str(data)]
    argv += ["--samples", str(args.samples), "--calls", str(args.calls)]
    done = subprocess.run(
        argv, cwd=tree, env=env, check=True, capture_output=True, text=True, timeout=600
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def measure(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-tool-cancel-") as tmp:
        base_dir, data = Path(tmp) / "baseline", Path(tmp) / "tree"
        base_dir.mkdir()
        data.mkdir()
        commit = _baseline_tree(args.baseline_ref, base_dir)
        _log(args, f"baseline {args.baseline_ref} ({commit}) in {base_dir}")
        _make_tree(data, args.files)
        trees = {"new": ROOT, "baseline": base_dir}
        got: dict[str, dict[str, list[float]]] = {
            k: {"bash": [], "grep": [], "call_us": []} for k in trees
        }
        early = dict.fromkeys(trees, 0)
        for r in range(args.rounds):
            order = ["new", "baseline"] if r % 2 == 0 else ["baseline", "new"]
            for which in order:
                out = _run_inner(trees[which], args, data)
                assert out["actors"] == str(trees[which]), (out["actors"], trees[which])
                for key, values in out["samples"].items():
                    got[which][key] += values
                early[which] += out["grep_finished_before_cancel"]
                _log(args, f"round {r + 1}/{args.rounds}: {which} done")
    return _report(args, commit, got, early)


def _report(
    args: argparse.Namespace,
    commit: str,
    got: dict[str, dict[str, list[float]]],
    early: dict[str, int],
) -> dict[str, Any]:
    def p(which: str, key: str, q: float) -> float:
        return round(percentile(got[which][key], q), 2)

    label = f"{args.baseline_ref} ({commit}), same run"
    figures: list[dict[str, Any]] = []
    targets: list[dict[str, Any]] = []
    for key, what in (("bash", "bash sleep 30 group ended"), ("grep", "grep file loop ended")):
        for q, name in ((0.5, "p50"), (0.99, "p99")):
            value, base = p("new", key, q), p("baseline", key, q)
            figure = {
                "name": f"cancel -> {what}, {name}",
                "value": value,
                "unit": "ms",
                "baseline": base,
                "baseline_label": label,
                "ratio": round(value / base, 2) if base else None,
                "target": None,
                "pass": None,
            }
            if name == "p99":
                figure["target"] = f"<= {TARGET_P99_MS:g} ms"
                figure["pass"] = value <= TARGET_P99_MS
                targets.append(
                    {
                        "name": f"cancel -> {what}, p99 <= {TARGET_P99_MS:g} ms",
                        "value": value,
                        "unit": "ms",
                        "pass": figure["pass"],
                    }
                )
            figures.append(figure)
    value, base = p("new", "call_us", 0.5), p("baseline", "call_us", 0.5)
    figures.append(
        {
            "name": "trivial tool call, sequential, per call",
            "value": value,
            "unit": "µs",
            "baseline": base,
            "baseline_label": label,
            "ratio": round(value / base, 2) if base else None,
            "target": None,
            "pass": None,
        }
    )
    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "baseline_ref": args.baseline_ref,
        "baseline_commit": commit,
        "rounds": args.rounds,
        "samples_per_round": args.samples,
        "files": args.files,
        "grep_finished_before_cancel": early,
        "figures": figures,
        "targets": targets,
    }


def _num(value: float, unit: str) -> str:
    return f"{value:,.2f} {unit}"


def render(report: dict[str, Any]) -> str:
    lines = [
        f"sessionrt tool-cancel benchmark: {report['rounds']} rounds x"
        f" {report['samples_per_round']} samples per tree, baseline {report['baseline_ref']}"
        f" ({report['baseline_commit']}), load {report['load_average']},"
        f" Python {report['python']}, {report['cpus']} CPUs",
        "",
    ]
    for f in report["figures"]:
        lines.append(
            f"  {f['name']}: {_num(f['value'], f['unit'])}"
            f" (baseline {_num(f['baseline'], f['unit'])}; {f['ratio']}x)"
        )
    if any(report["grep_finished_before_cancel"].values()):
        lines.append(
            f"  greps that finished before the cancel: {report['grep_finished_before_cancel']}"
        )
    lines.append("")
    lines += target_lines(report["targets"], _num, heading="targets (informational):")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--baseline-ref", default="main", help="git ref of the baseline tree")
    parser.add_argument("--rounds", type=int, default=4, help="subprocesses per tree")
    parser.add_argument("--samples", type=int, default=25, help="cancels per figure per round")
    parser.add_argument("--calls", type=int, default=500, help="trivial calls per round")
    parser.add_argument("--files", type=int, default=20_000, help="files in the grep tree")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tree", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.inner:
        print(json.dumps(asyncio.run(_inner(args))))
        return 0
    return report_main(lambda: measure(args), render, as_json=args.json, hard_limit_s=1800)


if __name__ == "__main__":
    sys.exit(main())
