#!/usr/bin/env python3
"""Snapshot cost per writing step on a 10,000-file git work tree, and revert (issue #13).

    .venv/bin/python scripts/bench_snapshot.py            # table
    .venv/bin/python scripts/bench_snapshot.py --json     # one JSON object on stdout
    .venv/bin/python scripts/bench_snapshot.py --files 10000 --runs 7

One tree (``--files`` files in 1,100 directories, committed, with a
``.gitignore``), real git processes, three things measured in the same run
and alternated run by run so they see the same machine and load:

- **new**: :class:`~actors.files.snapshots.StepWrites` as a step runs it (a
  ``prepare`` just before each writing call, ``record`` at the end) on a
  :class:`~actors.files.snapshots.Snapshots` with its inotify watch: git is told
  only the paths the watch saw change;
- **previous** (the baseline): the same ``StepWrites`` on a store with the
  watch off (``watch=False``), which is what a step paid before change
  tracking: a full ``git add --all`` before and after a bash step, one git
  process per write call;
- ``git status --porcelain`` of the project's own repository, at the start
  and at the end (what any git-aware editor pays to look at the tree).

Steps: write/edit changing 1 file and 10 files (10 calls in one step), bash
changing 1 and 10 files, and a bash step that makes a new nested directory
with 10 files, deletes one file and renames another. Before each timed step
both stores are brought up to date untimed (so one approach's edits are not
billed to the other), and after each new step its "after" tree is checked to
be the very tree id a full scan gives (trees are content-addressed), so the
figure is of a correct snapshot. The time is that of the snapshot calls
alone (the tool's own file work between them is not counted). Also shown:
git processes per step, the cold first snapshot, and the revert of 100
changed files. Target: <= 50 ms per writing step (median).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _benchlib import report_main, target_lines

from actors.files.snapshots import Snapshots, StepWrites

TARGET_STEP_MS = 50.0


class Counting(Snapshots):
    """A store that counts the git processes it starts (for the per-step figure)."""

    gits = 0

    async def _git(self, work: Path, *args: str, **kw: Any) -> bytes:
        self.gits += 1
        return await super()._git(work, *args, **kw)


def make_tree(root: Path, files: int) -> list[Path]:
    paths = []
    for i in range(files):
        d = root / f"pkg{i % 100:02d}" / f"mod{(i // 100) % 10}"
        d.mkdir(parents=True, exist_ok=True)
        p = d / f"file{i:05d}.py"
        p.write_text(f"# file {i}\n" + "x = 1\n" * 40)
        paths.append(p)
    (root / ".gitignore").write_text("build/\n")
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    subprocess.run(
        ["git", "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "tree"],
        cwd=root,
        check=True,
    )
    return paths


def med(values: list[float]) -> float:
    return round(statistics.median(values), 2)


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    say: Callable[[str], None] = (
        (lambda _: None) if args.quiet else (lambda text: print(text, file=sys.stderr, flush=True))
    )
    tmp = Path(tempfile.mkdtemp(prefix="bench-snapshot-"))
    try:
        return await _measure(args, tmp, say)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def _measure(
    args: argparse.Namespace, tmp: Path, say: Callable[[str], None]
) -> dict[str, Any]:
    root = tmp / "project"
    root.mkdir()
    paths = make_tree(root, args.files)
    say(f"tree: {args.files} files")
    new = Counting(tmp / "new")
    previous = Counting(tmp / "previous", watch=False)

    async def status() -> float:
        start = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(
            "git", "status", "--porcelain", cwd=root, stdout=asyncio.subprocess.DEVNULL
        )
        await proc.wait()
        return (time.perf_counter() - start) * 1000

    await status()
    status_before = [await status() for _ in range(args.runs)]
    cold: dict[str, float] = {}
    for name, store in (("new", new), ("previous", previous)):
        start = time.perf_counter()
        await store.track(root)
        cold[name] = (time.perf_counter() - start) * 1000
    say(f"cold first snapshot: new {cold['new']:.0f} ms, previous {cold['previous']:.0f} ms")

    offset = 0
    serial = 0

    def bash_tree(touched: list[Path]) -> None:
        """A bash step's changes: a new nested directory, a delete, a rename."""
        nonlocal serial
        serial += 1
        nest = root / f"gen{serial}" / "a" / "b"
        nest.mkdir(parents=True)
        for i in range(10):
            (nest / f"n{i}.txt").write_text(f"{serial} {i}\n")
        touched[0].unlink()
        touched[1].rename(touched[1].with_name(f"moved{serial}.py"))

    def edit(touched: list[Path], r: int) -> None:
        for p in touched:
            p.write_text(p.read_text() + f"y = {r}\n")

    steps = (
        ("write/edit step, 1 file", "write", 1),
        ("write/edit step, 10 files (10 calls)", "write", 10),
        ("bash step, 1 file changed", "bash", 1),
        ("bash step, 10 files changed", "bash", 10),
        ("bash step, new nested dir + delete + rename", "tree", 2),
    )
    results: dict[str, dict[str, list[float]]] = {}
    for label, kind, count in steps:
        times: dict[str, list[float]] = {"new": [], "previous": [], "gits_new": [], "gits_prev": []}
        for r in range(args.runs):
            for name, store in (("new", new), ("previous", previous)):
                touched = paths[offset : offset + count]
                offset += count
                await new.track(root)  # untimed: absorb the other approach's edits
                await previous.track(root)
                gits = store.gits
                writes = StepWrites(store, str(root))
                spent = 0.0  # the snapshot calls' time, not the tool's own work
                if kind == "write":
                    for p in touched:
                        start = time.perf_counter()
                        await writes.before_run("write", {"path": str(p.relative_to(root))})
                        spent += time.perf_counter() - start
                        edit([p], r)
                else:
                    start = time.perf_counter()
                    await writes.before_run("bash", {"command": "(bench)"})
                    spent += time.perf_counter() - start
                    if kind == "bash":
                        edit(touched, r)
                    else:
                        bash_tree(touched)
                start = time.perf_counter()
                recorded = await writes.record()
                spent += time.perf_counter() - start
                times[name].append(spent * 1000)
                times["gits_new" if name == "new" else "gits_prev"].append(store.gits - gits)
                assert recorded is not None
                assert recorded.files, label
                if name == "new":
                    full = await previous.track(root)
                    assert recorded.after == full, (label, "not what a full scan gives")
        results[label] = times
        say(f"{label}: new {med(times['new']):.1f} ms, previous {med(times['previous']):.1f} ms")
    status_after = [await status() for _ in range(args.runs)]

    reverts = []
    for r in range(max(3, args.runs // 2)):
        before = await new.track(root)
        assert before is not None
        victims = paths[5000 + r * 100 : 5100 + r * 100]
        originals = {p: p.read_bytes() for p in victims if p.exists()}
        for p in originals:
            p.write_text("changed\n")
        after = await new.track(root)
        assert after is not None
        files = await new.changed(root, before, after)
        start = time.perf_counter()
        await new.restore(root, [(before, files)])
        reverts.append((time.perf_counter() - start) * 1000)
        assert all(p.read_bytes() == b for p, b in originals.items())
    say(f"revert of 100 files: {med(reverts):.1f} ms")
    await new.aclose()
    await previous.aclose()

    figures = []
    targets = []
    for label, times in results.items():
        value, base = med(times["new"]), med(times["previous"])
        passed = value <= TARGET_STEP_MS
        figures.append(
            {
                "name": f"{label}, median",
                "value": value,
                "unit": "ms",
                "baseline": base,
                "baseline_label": "previous: no watch",
                "ratio": round(value / base, 2) if base else None,
                "target": f"<= {TARGET_STEP_MS:g} ms",
                "pass": passed,
                "max": round(max(times["new"]), 2),
                "git_processes": statistics.median(times["gits_new"]),
                "git_processes_baseline": statistics.median(times["gits_prev"]),
            }
        )
        targets.append(
            {
                "name": f"{label} <= {TARGET_STEP_MS:g} ms",
                "value": value,
                "unit": "ms",
                "pass": passed,
            }
        )
    status_all = status_before + status_after
    figures += [
        {
            "name": "git status --porcelain of the tree, median (start / end)",
            "value": med(status_all),
            "unit": "ms",
            "baseline": None,
            "start": med(status_before),
            "end": med(status_after),
        },
        {
            "name": "first snapshot (cold, with the watch set up)",
            "value": round(cold["new"], 2),
            "unit": "ms",
            "baseline": round(cold["previous"], 2),
            "baseline_label": "previous: no watch",
            "ratio": round(cold["new"] / cold["previous"], 2) if cold["previous"] else None,
        },
        {
            "name": "revert of 100 changed files, median",
            "value": med(reverts),
            "unit": "ms",
            "baseline": None,
        },
    ]
    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load": os.getloadavg(),
        "files": args.files,
        "runs": args.runs,
        "figures": figures,
        "targets": targets,
    }


def _num(value: float, unit: str) -> str:
    return f"{value:,.1f} {unit}"


def render(report: dict[str, Any]) -> str:
    load = ", ".join(f"{x:.2f}" for x in report["load"])
    lines = [
        f"sessionrt snapshot benchmark: {report['files']} files, {report['runs']} runs,"
        f" Python {report['python']}, {report['cpus']} CPUs, load {load}",
        "",
    ]
    for f in report["figures"]:
        text = f"  {f['name']}: {_num(f['value'], f['unit'])}"
        if f.get("baseline") is not None:
            text += f" (baseline {_num(f['baseline'], f['unit'])}, {f['baseline_label']};"
            text += f" {f['ratio']:.2f}x)"
        if "git_processes" in f:
            text += f"; git processes {f['git_processes']:g} vs {f['git_processes_baseline']:g}"
        lines.append(text)
    lines.append("")
    lines += target_lines(report["targets"], _num, heading="targets (informational):")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("GIT_CONFIG_NOSYSTEM", "1")
    return report_main(
        lambda: asyncio.run(measure(args)), render, as_json=args.json, hard_limit_s=900
    )


if __name__ == "__main__":
    sys.exit(main())
