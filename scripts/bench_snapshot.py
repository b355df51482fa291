"""Snapshot and revert cost on a 10,000-file git work tree (issue #13).

Figures, each the median of ``--runs`` runs, all measured in this run on the
same tree:

- baseline: ``git status --porcelain`` of the project's own repository (what
  any git-aware editor pays to look at the tree), and the cost of starting one
  git process (``git --version``): the floor of any git-based step;
- the first snapshot of the tree (cold: every file hashed into the store);
- per writing step, the whole snapshot cost a step pays, for a write/edit
  step changing 1 / 10 files and for a bash step (a full look):
  - new: :class:`~actors.snapshots.StepWrites` as the step runs it (a
    ``prepare`` just before each writing call, ``record`` at the end);
  - old: the approach it replaced, replayed with the same git commands on a
    store of its own (a full snapshot at every step start, ``git add`` of the
    named paths + ``write-tree`` at the end, then a ``git diff`` for the files);
  target <= 50 ms for a write/edit step;
- the revert of 100 changed files (``restore`` to the earlier tree);
- with dulwich installed, the same incremental snapshot through dulwich's
  ``porcelain.add`` + ``write_tree`` on a store of its own, for the choice.

    .venv/bin/python scripts/bench_snapshot.py [--files 10000] [--runs 7]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from actors.snapshots import Snapshots, StepWrites


def edit(touched: list[Path], r: int) -> None:
    for p in touched:
        p.write_text(p.read_text() + f"y = {r}\n")


class OldApproach:
    """The snapshot cost before lazy snapshots, replayed with the same git commands."""

    def __init__(self, work: Path, store: Path) -> None:
        self.work = work
        self.env = {
            **os.environ,
            "GIT_DIR": str(store),
            "GIT_WORK_TREE": str(work),
            "GIT_LITERAL_PATHSPECS": "1",
            "LC_ALL": "C",
        }
        subprocess.run(["git", "init", "-q"], env=self.env, check=True)
        for key, value in (
            ("core.untrackedCache", "true"),
            ("index.version", "4"),
            ("core.preloadIndex", "true"),
            ("core.fsmonitor", "false"),
        ):
            subprocess.run(["git", "config", key, value], env=self.env, check=True)

    async def git(self, *args: str) -> bytes:
        proc = await asyncio.create_subprocess_exec(
            "git",
            *args,
            cwd=self.work,
            env=self.env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        out, _ = await proc.communicate()
        return out

    async def snapshot(self, paths: list[str] | None) -> str:
        await self.git("add", "--all", "--ignore-errors", "--", *(paths or ["."]))
        return (await self.git("write-tree")).decode().strip()

    async def step(self, touched: list[Path], paths: list[str] | None, r: int) -> tuple[str, ...]:
        before = await self.snapshot(None)  # at every step start
        edit(touched, r)
        after = await self.snapshot(paths)
        out = await self.git("diff", "--name-only", "-z", "--no-renames", before, after)
        return tuple(p for p in out.decode().split("\0") if p)


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


async def timed(fn: Callable[[], Awaitable[object]]) -> float:
    start = time.perf_counter()
    await fn()
    return (time.perf_counter() - start) * 1000


def ms(values: list[float]) -> str:
    low, high = min(values), max(values)
    return f"median {statistics.median(values):7.1f} ms  (min {low:.1f}, max {high:.1f})"


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "project"
        root.mkdir()
        paths = make_tree(root, args.files)
        store = Snapshots(Path(tmp) / "data" / "snapshot")
        print(f"tree: {args.files} files")

        async def status() -> None:
            proc = await asyncio.create_subprocess_exec(
                "git", "status", "--porcelain", cwd=root, stdout=asyncio.subprocess.DEVNULL
            )
            await proc.wait()

        await status()
        baseline = [await timed(status) for _ in range(args.runs)]
        print(f"baseline git status --porcelain : {ms(baseline)}")

        async def spawn() -> None:
            proc = await asyncio.create_subprocess_exec(
                "git", "--version", stdout=asyncio.subprocess.DEVNULL
            )
            await proc.wait()

        floor = [await timed(spawn) for _ in range(args.runs)]
        print(f"one git process (git --version) : {ms(floor)}  (a write step runs 3)")
        cold = await timed(lambda: store.track(root))
        print(f"first snapshot (cold)           : {cold:7.1f} ms")
        old = OldApproach(root, Path(tmp) / "old-store")
        await old.snapshot(None)
        offset = 0
        for bash in (False, True):
            for changed in (1, 10):
                new_runs, old_runs = [], []
                for r in range(args.runs):
                    for runs, approach in ((new_runs, "new"), (old_runs, "old")):
                        touched = paths[offset : offset + changed]
                        offset += changed
                        named = [str(p.relative_to(root)) for p in touched]

                        async def step(
                            touched: list[Path] = touched,
                            named: list[str] = named,
                            approach: str = approach,
                            r: int = r,
                            bash: bool = bash,
                        ) -> tuple[str, ...]:
                            if approach == "new":
                                writes = StepWrites(store, str(root))
                                for name in ["(bash)"] if bash else named:
                                    await writes.before_run(
                                        "bash" if bash else "write", {"path": name}
                                    )
                                edit(touched, r)
                                recorded = await writes.record()
                                assert recorded is not None
                                return recorded.files
                            return await old.step(touched, None if bash else named, r)

                        start = time.perf_counter()
                        files = await step()
                        runs.append((time.perf_counter() - start) * 1000)
                        assert sorted(files) == sorted(named), files
                label = "bash step (full look)" if bash else "write/edit step"
                print(f"per {label}, {changed:2d} file(s):")
                print(f"    new : {ms(new_runs)}  target <= 50 ms")
                print(f"    old : {ms(old_runs)}")
        status_after = [await timed(status) for _ in range(args.runs)]
        print(f"baseline git status again       : {ms(status_after)}")
        reverts = []
        for r in range(max(3, args.runs // 2)):
            before = await store.track(root)
            assert before is not None
            victims = paths[5000 + r * 100 : 5100 + r * 100]
            originals = {p: p.read_bytes() for p in victims}
            for p in victims:
                p.write_text("changed\n")
            after = await store.track(root)
            assert after is not None
            files = await store.changed(root, before, after)
            assert len(files) == 100
            reverts.append(await timed(functools.partial(store.restore, root, before, files)))
            assert all(p.read_bytes() == b for p, b in originals.items())
        print(f"revert of 100 changed files     : {ms(reverts)}")
        await dulwich_figures(root, paths, args.runs)


async def dulwich_figures(root: Path, paths: list[Path], runs: int) -> None:
    try:
        from dulwich import porcelain
        from dulwich.repo import Repo
    except ImportError:
        print("dulwich: not installed (pip install dulwich to compare)")
        return
    # dulwich cannot point a repository at a foreign work tree and store in
    # one call; a copy of the tree with its own .git stands in for it.
    target = root.parent / "dulwich"
    for argv in (["cp", "-a", str(root), str(target)], ["rm", "-rf", str(target / ".git")]):
        proc = await asyncio.create_subprocess_exec(*argv)
        assert await proc.wait() == 0
    repo = Repo.init(str(target))

    def snapshot() -> bytes:
        porcelain.add(repo, paths=None)
        return repo.open_index().commit(repo.object_store)

    start = time.perf_counter()
    snapshot()
    cold = (time.perf_counter() - start) * 1000
    print(f"dulwich first snapshot (cold)   : {cold:7.1f} ms")
    copies = [target / p.relative_to(root) for p in paths]
    timings = []
    for r in range(runs):
        p = copies[9000 + r]
        p.write_text(p.read_text() + "z\n")
        start = time.perf_counter()
        snapshot()
        timings.append((time.perf_counter() - start) * 1000)
    print(f"dulwich incremental, 1 file     : {ms(timings)}")
    repo.close()


if __name__ == "__main__":
    os.environ.setdefault("GIT_CONFIG_NOSYSTEM", "1")
    asyncio.run(main())
