"""Snapshot and revert cost on a 10,000-file git work tree (issue #13).

Figures, each the median of ``--runs`` runs, all measured in this run on the
same tree:

- baseline: ``git status --porcelain`` of the project's own repository (what
  any git-aware editor pays to look at the tree);
- the first snapshot of the tree (cold: every file hashed into the store);
- the incremental snapshot after a writing step changed 1 / 10 files (the
  cost a step pays: ``git add -A`` + ``write-tree`` in the separate store,
  plus the list of changed files) — target ≤ 50 ms;
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

from actors.snapshots import Snapshots


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
        cold = await timed(lambda: store.track(root))
        print(f"first snapshot (cold)           : {cold:7.1f} ms")
        offset = 0
        for known, label in ((True, "write/edit step"), (False, "bash step (full look)")):
            for changed in (1, 10):
                runs = []
                for r in range(args.runs):
                    before = await store.track(root)
                    assert before is not None
                    touched = paths[offset : offset + changed]
                    offset += changed
                    for p in touched:
                        p.write_text(p.read_text() + f"y = {r}\n")
                    named = [str(p.relative_to(root)) for p in touched] if known else None

                    async def step(
                        before: str = before, named: list[str] | None = named, n: int = changed
                    ) -> None:
                        after = await store.track(root, named)
                        assert after is not None
                        files = await store.changed(root, before, after)
                        assert len(files) == n, files

                    runs.append(await timed(step))
                print(f"incremental, {label}, {changed:2d} file(s): {ms(runs)}  target <= 50 ms")
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
