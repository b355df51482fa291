#!/usr/bin/env python3
"""The cost of instruction admission per step, next to today's step in the same run.

    .venv/bin/python scripts/bench_instructions.py            # table
    .venv/bin/python scripts/bench_instructions.py --steps 200 --json
    .venv/bin/python scripts/bench_instructions.py --synchronous NORMAL   # without fsync noise

Three runtimes, each on a fresh temp data dir (real SQLite file, ``synchronous=FULL``),
scripted model at zero delay, one session each; every step is one prompt
(``sessions.prompt(..., resume=False)`` then ``execution.resume``). Steps of the three
alternate, so all see the same disk and the same machine load:

- **baseline**: today's step, without instruction admission (``NoInstructions``: the
  agent's system prompt as it is, nothing read, nothing appended).
- **unchanged**: the built-in sources and 5 sources in all: built-ins (agent prompt,
  environment), AGENTS.md discovery (a 2 KiB AGENTS.md at the project root), one skill,
  one reference file, one API entry. Nothing changes between steps, so nothing is
  published: the cost is observing, hashing and diffing.
- **changed**: the same, with a 200 KiB AGENTS.md rewritten before every step (a new
  value each time): one delta, one 200 KiB blob, one frozen update text per step. Its
  history grows by one 200 KiB system message per step, which the request carries.

Printed: median and mean ms per step of each, the difference to the baseline, and the
cost of ``Instructions.prepare`` alone (called directly, no step around it): on the
unchanged session, and on the changed one with the file rewritten before each call.
Target (issue #11): unchanged <= 0.5 ms over the baseline step.
The exit status is 0 unless the benchmark itself fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from actors.runtime import Runtime, RuntimeConfig
from actors.session.drain import NoInstructions
from actors.session.instruction_admission import Instructions
from protocol.requests import CreateSessionInput, PromptInput

AGENTS_TOML = '[agents.build]\nreferences = ["docs/style.md"]\n'
SKILL = "---\nname: release\ndescription: Cut a release.\n---\nSteps...\n"


def project(root: Path) -> Path:
    work = root / "repo"
    (work / ".git").mkdir(parents=True)
    (work / ".sessionrt" / "skills" / "release").mkdir(parents=True)
    (work / ".sessionrt" / "skills" / "release" / "SKILL.md").write_text(SKILL)
    (work / ".sessionrt" / "agents.toml").write_text(AGENTS_TOML)
    (work / "docs").mkdir()
    (work / "docs" / "style.md").write_text("Write short sentences.\n" * 20)
    (work / "AGENTS.md").write_text("Project rule.\n" * 150)
    return work


class Bench:
    def __init__(self, name: str, rt: Runtime, work: Path, big: bool) -> None:
        self.name, self.rt, self.work, self.big = name, rt, work, big
        self.times: list[float] = []
        self.sid = ""
        self.n = 0

    async def setup(self) -> None:
        session = await self.rt.sessions.create(CreateSessionInput())
        self.sid = session.id
        await self.rt.instructions.put(self.sid, "goal", {"ship": "friday"})
        await self.step(record=False)

    async def step(self, *, record: bool = True) -> None:
        self.n += 1
        if self.big:
            line = f"step {self.n}: keep going.\n"
            (self.work / "AGENTS.md").write_text(line * (200 * 1024 // len(line)))
        start = time.perf_counter()
        await self.rt.sessions.prompt(self.sid, PromptInput(text=f"p{self.n}", resume=False))
        await self.rt.execution.resume(self.sid)
        if record:
            self.times.append((time.perf_counter() - start) * 1000)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        benches: list[Bench] = []
        async with contextlib_stack() as stack:
            for name, admission, big in (
                ("baseline", False, False),
                ("unchanged", True, False),
                ("changed", True, True),
            ):
                work = project(root / name)
                config = RuntimeConfig(
                    data_dir=root / name / "data",
                    default_directory=str(work),
                    instructions=None if admission else NoInstructions(),
                    synchronous=args.synchronous,
                )
                rt = await stack.enter_async_context(Runtime(config))
                bench = Bench(name, rt, work, big)
                await bench.setup()
                benches.append(bench)
            for _ in range(args.steps):
                for bench in benches:
                    await bench.step()
            # Admission alone, on the unchanged session: observe, hash, diff, no step.
            unchanged = benches[1]
            runner = unchanged.rt.services.drain
            assert runner is not None
            instructions = runner._instructions
            assert isinstance(instructions, Instructions)
            session = await unchanged.rt.sessions.get(unchanged.sid)
            agent = await unchanged.rt.agents.agent(session.location.directory, session.agent)
            prepare: list[float] = []
            for _ in range(args.steps):
                start = time.perf_counter()
                await instructions.prepare(session, agent)
                prepare.append((time.perf_counter() - start) * 1000)
            # Admission alone on the changed session: the rewrite is not timed; the
            # read, hash, render and the delta's commit (with its blob) are.
            changed = benches[2]
            csession = await changed.rt.sessions.get(changed.sid)
            cagent = await changed.rt.agents.agent(csession.location.directory, csession.agent)
            cinstructions = changed.rt.services.drain._instructions
            assert isinstance(cinstructions, Instructions)
            prepare_changed: list[float] = []
            for i in range(args.steps):
                line = f"direct {i}: keep going.\n"
                (changed.work / "AGENTS.md").write_text(line * (200 * 1024 // len(line)))
                start = time.perf_counter()
                await cinstructions.prepare(csession, cagent)
                prepare_changed.append((time.perf_counter() - start) * 1000)
            rows = await unchanged.rt.store.fetch(
                "SELECT count(*) FROM event WHERE aggregate_id = ? AND type LIKE"
                " 'session.instructions.updated.%'",
                (unchanged.sid,),
            )
            unchanged_events = rows[0][0]
            changed_rows = await benches[2].rt.store.fetch(
                "SELECT count(*), sum(length(value)) FROM instruction_blob"
            )
    base = statistics.median(benches[0].times)
    out: dict[str, Any] = {"steps": args.steps}
    for bench in benches:
        med = statistics.median(bench.times)
        out[bench.name] = {
            "median_ms": round(med, 3),
            "mean_ms": round(statistics.fmean(bench.times), 3),
            "over_baseline_ms": round(med - base, 3),
        }
    out["prepare_alone_ms"] = {
        "median": round(statistics.median(prepare), 3),
        "p90": round(sorted(prepare)[int(len(prepare) * 0.9)], 3),
    }
    out["prepare_alone_changed_ms"] = {
        "median": round(statistics.median(prepare_changed), 3),
        "p90": round(sorted(prepare_changed)[int(len(prepare_changed) * 0.9)], 3),
    }
    out["changed_first10_median_ms"] = round(statistics.median(benches[2].times[:10]), 3)
    out["baseline_first10_median_ms"] = round(statistics.median(benches[0].times[:10]), 3)
    out["synchronous"] = args.synchronous
    out["unchanged_deltas_published"] = unchanged_events  # the initial one only
    out["changed_blobs"] = {"rows": changed_rows[0][0], "bytes": changed_rows[0][1]}
    return out


def contextlib_stack() -> Any:
    import contextlib

    return contextlib.AsyncExitStack()


def table(out: dict[str, Any]) -> str:
    lines = [
        f"instruction admission per step ({out['steps']} steps each, alternating,"
        f" synchronous={out['synchronous']})"
    ]
    lines.append(f"{'':<10} {'median ms':>10} {'mean ms':>10} {'over base':>10}")
    for name in ("baseline", "unchanged", "changed"):
        r = out[name]
        med, mean, over = r["median_ms"], r["mean_ms"], r["over_baseline_ms"]
        lines.append(f"{name:<10} {med:>10.3f} {mean:>10.3f} {over:>10.3f}")
    p = out["prepare_alone_ms"]
    lines.append(f"prepare() alone, unchanged: median {p['median']:.3f} ms, p90 {p['p90']:.3f} ms")
    p = out["prepare_alone_changed_ms"]
    lines.append(
        f"prepare() alone, 200 KiB AGENTS.md changed: median {p['median']:.3f} ms,"
        f" p90 {p['p90']:.3f} ms (includes the delta's commit)"
    )
    lines.append(
        f"first 10 steps, median: baseline {out['baseline_first10_median_ms']:.3f} ms,"
        f" changed {out['changed_first10_median_ms']:.3f} ms (later steps carry every update)"
    )
    lines.append(f"deltas published on the unchanged session: {out['unchanged_deltas_published']}")
    b = out["changed_blobs"]
    lines.append(f"blobs on the changed session: {b['rows']} rows, {b['bytes']} bytes")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--synchronous", choices=["FULL", "NORMAL"], default="FULL")
    ns = parser.parse_args()
    result = asyncio.run(main(ns))
    print(json.dumps(result) if ns.json else table(result))
