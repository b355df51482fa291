"""Watched snapshots (inotify change tracking) are exactly what a full scan gives.

Each test runs real shell commands in a real git work tree between the
snapshots of two stores on the same tree: one with its watch (git told only
the paths the watch saw change), one with the watch off (a full ``git add
--all`` every time). Trees are content-addressed, so equal tree ids mean equal
snapshots. Each test also says whether the watched store had to fall back to
a full scan, so the shortcut (or the fallback) is what was tested.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from actors.files.snapshots import Recorded, Snapshots, StepWrites

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="inotify is Linux's")


class Watched(Snapshots):
    """A store that counts its full scans (``git add --all -- .``)."""

    def __init__(self, root: Path, **kw: Any) -> None:
        super().__init__(root, **kw)
        self.full_scans = 0

    async def _refresh_full(self, work: Path, watch: Any, exclude: Any) -> Any:
        self.full_scans += 1
        return await super()._refresh_full(work, watch, exclude)


async def sh(repo: Path, command: str) -> None:
    proc = await asyncio.create_subprocess_exec("bash", "-ec", command, cwd=repo)
    assert await proc.wait() == 0, command


class Pair:
    """The watched store and the full-scan store on one tree, stepped together."""

    def __init__(self, tmp: Path, repo: Path, **kw: Any) -> None:
        self.repo = repo
        self.watched = Watched(tmp / "watched", **kw)
        self.full = Snapshots(tmp / "full", watch=False)

    async def start(self) -> None:
        first = await self.watched.track(self.repo)
        assert first == await self.full.track(self.repo)
        self.watched.full_scans = 0  # the first snapshot is always one

    async def bash_step(self, command: str) -> Recorded:
        """A step running one bash command; its trees checked against full scans."""
        before = await self.full.track(self.repo)
        writes = StepWrites(self.watched, str(self.repo))
        await writes.before_run("bash", {"command": command})
        await sh(self.repo, command)
        recorded = await writes.record()
        assert recorded is not None
        assert recorded.before == before, f"before {command!r}"
        assert recorded.after == await self.full.track(self.repo), f"after {command!r}"
        assert recorded.files == await self.full.changed(self.repo, before, recorded.after)
        return recorded

    async def close(self) -> None:
        await self.watched.aclose()
        await self.full.aclose()


@pytest.fixture
async def pair(tmp_path: Path, repo: Path) -> Any:
    p = Pair(tmp_path, repo)
    await p.start()
    yield p
    await p.close()


async def test_creates_modifies_deletes_and_renames_need_no_full_scan(pair: Pair) -> None:
    r = await pair.bash_step("echo new > n.txt && echo more >> a.txt && rm keep.txt")
    assert r.files == ("a.txt", "keep.txt", "n.txt")
    r = await pair.bash_step("mv n.txt m.txt")
    assert r.files == ("m.txt", "n.txt")
    # sed -i writes a temporary file and renames it over: a path that came and went.
    r = await pair.bash_step("sed -i s/alpha/omega/ a.txt")
    assert r.files == ("a.txt",)
    r = await pair.bash_step("true")
    assert r.files == ()
    assert r.before == r.after
    assert pair.watched.full_scans == 0


async def test_new_nested_directories_are_watched_from_their_first_file(pair: Pair) -> None:
    r = await pair.bash_step("mkdir -p d1/d2/d3 && echo x > d1/d2/d3/f && echo y > d1/g")
    assert r.files == ("d1/d2/d3/f", "d1/g")
    # Changes inside the new directories, a step later: their watches are in place.
    r = await pair.bash_step("echo z >> d1/d2/d3/f && mkdir d1/d2/d3/d4 && echo w > d1/d2/d3/d4/h")
    assert r.files == ("d1/d2/d3/d4/h", "d1/d2/d3/f")
    r = await pair.bash_step("echo v >> d1/d2/d3/d4/h")
    assert r.files == ("d1/d2/d3/d4/h",)
    assert pair.watched.full_scans == 0


async def test_directory_renames_deletes_and_file_directory_swaps(pair: Pair) -> None:
    await pair.bash_step("mkdir -p top/sub && echo 1 > top/sub/f && echo 2 > top/g")
    r = await pair.bash_step("mv top moved")
    assert r.files == ("moved/g", "moved/sub/f", "top/g", "top/sub/f")
    # The moved directory's watches follow it: a change under the new name is seen.
    r = await pair.bash_step("echo 3 >> moved/sub/f")
    assert r.files == ("moved/sub/f",)
    r = await pair.bash_step("rm -rf moved")
    assert r.files == ("moved/g", "moved/sub/f")
    r = await pair.bash_step("rm a.txt && mkdir a.txt && echo in > a.txt/inner")
    assert r.files == ("a.txt", "a.txt/inner")
    r = await pair.bash_step("rm -r a.txt && echo back > a.txt")
    assert r.files == ("a.txt", "a.txt/inner")
    assert pair.watched.full_scans == 0


async def test_ignored_files_chmod_and_symlinks(pair: Pair) -> None:
    r = await pair.bash_step("mkdir -p ignored && echo x > ignored/x && echo l > run.log")
    assert r.files == ()  # .gitignore'd: left alone
    r = await pair.bash_step("chmod +x a.txt")
    assert r.files == ("a.txt",)
    r = await pair.bash_step("mkdir real && echo r > real/f && ln -s a.txt link && ln -s real dl")
    assert r.files == ("dl", "link", "real/f")
    # A change through the directory symlink is a change in real/.
    r = await pair.bash_step("echo s >> dl/f && ln -sfn keep.txt link")
    assert r.files == ("link", "real/f")
    assert pair.watched.full_scans == 0


async def test_a_changed_gitignore_rescans_what_it_governs(pair: Pair) -> None:
    await pair.bash_step("mkdir -p sub/build && echo o > sub/build/o && echo b > sub/keep")
    # A nested .gitignore: its directory is rescanned, no full scan.
    r = await pair.bash_step("echo 'keep' > sub/.gitignore")
    assert r.files == ("sub/.gitignore",)
    r = await pair.bash_step("rm sub/.gitignore")
    assert r.files == ("sub/.gitignore",)
    assert pair.watched.full_scans == 0
    # The root's .gitignore un-ignores files already there: a full scan finds them.
    r = await pair.bash_step("echo x > run.log && printf 'ignored/\\n' > .gitignore")
    assert r.files == (".gitignore", "run.log")
    assert pair.watched.full_scans == 1


async def test_write_calls_then_bash_in_one_step_keep_the_before(pair: Pair) -> None:
    repo = pair.repo
    before = await pair.full.track(repo)
    writes = StepWrites(pair.watched, str(repo))
    await writes.before_run("write", {"path": "a.txt"})
    (repo / "a.txt").write_text("written\n")
    await writes.before_run("write", {"path": "new/dir/c.txt"})
    (repo / "new" / "dir").mkdir(parents=True)
    (repo / "new" / "dir" / "c.txt").write_text("c\n")
    await writes.before_run("bash", {"command": "rm keep.txt"})
    await sh(repo, "rm keep.txt && echo d > new/d.txt")
    recorded = await writes.record()
    assert recorded is not None
    assert recorded.before == before
    assert recorded.after == await pair.full.track(repo)
    assert recorded.files == ("a.txt", "keep.txt", "new/d.txt", "new/dir/c.txt")
    # Ten write calls in one step: git runs for the step, not for each call.
    gits: list[tuple[str, ...]] = []
    original = pair.watched._git

    async def counting(work: Path, *args: str, **kw: Any) -> bytes:
        gits.append(args)
        return await original(work, *args, **kw)

    pair.watched._git = counting  # type: ignore[method-assign]
    writes = StepWrites(pair.watched, str(repo))
    for i in range(10):
        await writes.before_run("edit", {"path": f"f{i}.txt"})
        (repo / f"f{i}.txt").write_text(f"{i}\n")
    recorded = await writes.record()
    assert recorded is not None
    assert len(recorded.files) == 10
    assert [a[0] for a in gits] == ["add", "write-tree"]
    assert recorded.after == await pair.full.track(repo)


async def test_a_work_tree_named_through_a_symlink_is_watched(tmp_path: Path, repo: Path) -> None:
    link = tmp_path / "link-to-project"
    link.symlink_to(repo, target_is_directory=True)
    pair = Pair(tmp_path, link)
    await pair.start()
    try:
        r = await pair.bash_step("echo more >> a.txt && mkdir -p x/y && echo 1 > x/y/z")
        assert r.files == ("a.txt", "x/y/z")
        r = await pair.bash_step("echo 2 >> x/y/z")
        assert r.files == ("x/y/z",)
        assert pair.watched.full_scans == 0
    finally:
        await pair.close()


async def test_too_many_changes_fall_back_to_a_full_scan(tmp_path: Path, repo: Path) -> None:
    pair = Pair(tmp_path, repo, max_dirty=5)
    await pair.start()
    try:
        await pair.bash_step("for i in $(seq 20); do echo $i > f$i; done")
        assert pair.watched.full_scans == 1
        # Trusted again after it: a small step needs none.
        await pair.bash_step("echo 1 >> f1")
        assert pair.watched.full_scans == 1
    finally:
        await pair.close()


async def test_a_kernel_queue_overflow_falls_back_to_a_full_scan(
    tmp_path: Path, repo: Path
) -> None:
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())  # noqa: ASYNC240
    if limit > 100_000:
        pytest.skip("the kernel's event queue is too long to overflow cheaply")
    pair = Pair(tmp_path, repo, max_dirty=10 * limit)
    await pair.start()
    try:
        await pair.bash_step("mkdir many")  # watched: its events count
        writes = StepWrites(pair.watched, str(repo))
        before = await pair.full.track(repo)
        await writes.before_run("bash", {"command": "(many files)"})
        # Blocking on purpose: the loop cannot read events, so the kernel's queue fills.
        subprocess.run(  # noqa: ASYNC221
            [
                sys.executable,
                "-c",
                "import os, sys\n"
                "for i in range(int(sys.argv[1])):\n"
                "    open(f'many/f{i}', 'w').close()\n",
                str(limit + 1000),
            ],
            cwd=repo,
            check=True,
        )
        (repo / "a.txt").write_text("after the overflow\n")
        recorded = await writes.record()
        assert recorded is not None
        assert recorded.before == before
        assert recorded.after == await pair.full.track(repo)
        assert "a.txt" in recorded.files
        assert pair.watched.full_scans == 1
        await pair.bash_step("echo 1 >> many/f1 && mkdir many/sub && echo 2 > many/sub/x")
        assert pair.watched.full_scans == 1
    finally:
        await pair.close()


async def test_no_watch_available_means_full_scans(tmp_path: Path, repo: Path) -> None:
    # Without a watch a bash step scans twice (before and after); with one that
    # breaks at the first new directory, from that step's end on.
    for i, (kw, scans) in enumerate((({"max_watches": 1}, 3), ({"watch": False}, 4))):
        pair = Pair(tmp_path / f"case{i}", repo, **kw)
        await pair.start()
        try:
            # max_watches 1: the root fits, a new directory does not: the watch breaks.
            await pair.bash_step(f"mkdir -p w{i}/x && echo 1 > w{i}/x/f")
            await pair.bash_step(f"echo 2 >> w{i}/x/f && echo {i} >> a.txt")
            assert pair.watched.full_scans == scans
        finally:
            await pair.close()


async def test_aclose_closes_every_watch(tmp_path: Path, repo: Path) -> None:
    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    start = fds()
    store = Snapshots(tmp_path / "store")
    assert await store.track(repo) is not None
    assert fds() == start + 1  # one inotify descriptor for the tree
    await store.aclose()
    assert fds() == start


def inotify_fds() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify":
                count += 1
        except OSError:
            continue
    return count


async def test_the_host_closes_its_watches_at_shutdown(tmp_path: Path, repo: Path) -> None:
    from protocol.requests import CreateSessionInput, PromptInput
    from protocol.shapes import Location
    from server.embedded import Embedded

    start = inotify_fds()
    async with Embedded(tmp_path / "data") as oc:
        s = await oc.sessions.create(CreateSessionInput(location=Location(directory=str(repo))))
        opened = inotify_fds()  # the host's own (the instruction observation cache's)
        await oc.sessions.prompt(
            s.id, PromptInput(text='#tool bash {"command": "echo x > made.txt"}\n---\n#text ok')
        )
        await oc.sessions.wait(s.id)
        assert inotify_fds() == opened + 1  # the step's directory is watched
    assert inotify_fds() == start
