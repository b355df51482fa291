"""File snapshots of a session's directory, kept outside the project tree.

Each work tree gets its own git object store under the data directory
(``<data>/snapshot/<hash of the work tree's path>``), driven through the
``git`` command-line program with ``GIT_DIR``/``GIT_WORK_TREE``: the
project's own ``.git`` is never read or written, and nothing is added to the
project. A snapshot is a tree id: ``git add -A`` (which honours the project's
``.gitignore``, so ignored files are never captured, restored or deleted)
then ``git write-tree``. The index git keeps in the store caches file stat
data, so a snapshot after a step that changed a few files re-hashes only
those; ``scripts/bench_snapshot.py`` measures it.

Why the git CLI rather than dulwich: dulwich's ``add`` re-hashes in Python
and ships no stat-cache fast path comparable to git's index refresh; on the
10,000-file tree of the benchmark the CLI's incremental snapshot is what
meets the 50 ms target (see the benchmark's figures), and git is already a
prerequisite of every project that has a ``.gitignore`` to honour.

Only directories inside a git work tree are snapshotted (as OpenCode does):
anywhere else (a home directory, ``/tmp``) ``track`` answers None and the
step records no snapshot, so an unbounded tree is never walked.

Every call runs git as an asyncio subprocess (never blocking the loop) and
holds the store's lock: one git index, one writer. The per-store locks live
only while used (:class:`~actors._keyed_lock.KeyedLock`).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import os
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Final, Literal

from actors._keyed_lock import KeyedLock
from protocol.shapes import FileDiff

__all__ = ["Blocking", "SnapshotError", "Snapshots"]

Blocking = Callable[..., Awaitable[Any]]

#: Bytes of one file's patch kept in a diff; longer patches are cut there.
MAX_PATCH_BYTES: Final = 256 * 1024
#: Files a diff reports at most (each costs one git call).
MAX_DIFF_FILES: Final = 1000


class SnapshotError(Exception):
    """git failed (the environment broke it): the message carries git's stderr."""


class Snapshots:
    def __init__(
        self, root: Path, *, exclude: Sequence[Path] = (), blocking: Blocking = asyncio.to_thread
    ) -> None:
        #: Where the stores live: ``<data dir>/snapshot``.
        self.root = root
        #: Runs the few blocking file-system calls (stats, the exclude file, removals):
        #: the runtime's bounded BlockingExecutor, never the loop's default pool.
        self._blocking = blocking
        #: Server directories never captured even if they lie inside a project.
        self._exclude = tuple(exclude)
        self._locks = KeyedLock()

    # -- the public operations ------------------------------------------------------------------

    async def track(self, directory: str | Path, paths: Sequence[str] | None = None) -> str | None:
        """Snapshot ``directory`` now; its tree id, or None outside a git work tree.

        With ``paths`` (the files a step's write/edit calls named), only those
        are looked at: everything else is as the previous snapshot left it in
        the store's index. That is what keeps a writing step's snapshot cheap
        on a large tree; a full look (``paths`` None) costs about a ``git status``.
        """
        work = Path(directory)
        if not await self._blocking(_in_git_work_tree, work):
            return None
        async with self._locks.hold(self._store(work).name):
            if not await self._ensure(work):
                paths = None  # a new store has no index to build on
            await self._git(
                work, "add", "--all", "--ignore-errors", "--", *(paths or ["."]), check=False
            )
            return (await self._git(work, "write-tree")).decode().strip()

    async def changed(self, directory: str | Path, a: str, b: str) -> tuple[str, ...]:
        """Paths that differ between trees ``a`` and ``b``, sorted."""
        work = Path(directory)
        if a == b:
            return ()
        out = await self._git(work, "diff", "--name-only", "-z", "--no-renames", a, b)
        return tuple(sorted(p for p in out.decode("utf-8", "surrogateescape").split("\0") if p))

    async def restore(self, directory: str | Path, tree: str, files: Sequence[str]) -> None:
        """Make each of ``files`` in ``directory`` what it is in ``tree``, bytes and mode.

        A file ``tree`` does not have is deleted. Paths are confined to
        ``directory``: a path that escapes it (``..``, an absolute path, a
        symlinked parent pointing outside) is refused before anything changes.
        """
        work = Path(directory)
        if not files:
            return
        base = await self._blocking(_confine_all, work, files)
        async with self._locks.hold(self._store(work).name):
            listed = await self._git(work, "ls-tree", "-r", "-z", "--name-only", tree, "--", *files)
            present = [p for p in listed.decode("utf-8", "surrogateescape").split("\0") if p]
            absent = sorted(set(files) - set(present))
            if present:
                await self._git(work, "checkout", tree, "--", *present)
            await self._blocking(_remove, base, absent)

    async def diff(
        self, directory: str | Path, a: str, b: str, *, context: int = 3
    ) -> list[FileDiff]:
        """File diffs from tree ``a`` to tree ``b`` (at most ``MAX_DIFF_FILES`` files)."""
        work = Path(directory)
        out = await self._git(work, "diff", "--no-renames", "--numstat", "-z", a, b)
        result: list[FileDiff] = []
        status = await self._statuses(work, a, b)
        for entry in out.decode("utf-8", "surrogateescape").split("\0"):
            if not entry:
                continue
            added, deleted, name = entry.split("\t", 2)
            binary = added == "-"
            patch = b""
            if not binary:
                patch = await self._git(
                    work, "diff", "--no-renames", f"-U{context}", a, b, "--", name
                )
            result.append(
                FileDiff(
                    file=name,
                    status=status.get(name, "modified"),
                    additions=0 if binary else int(added),
                    deletions=0 if binary else int(deleted),
                    patch=patch[:MAX_PATCH_BYTES].decode("utf-8", "replace"),
                    binary=binary,
                )
            )
            if len(result) >= MAX_DIFF_FILES:
                break
        return result

    # -- helpers --------------------------------------------------------------------------------

    async def _statuses(
        self, work: Path, a: str, b: str
    ) -> dict[str, Literal["added", "deleted", "modified"]]:
        out = await self._git(work, "diff", "--no-renames", "--name-status", "-z", a, b)
        fields = [f for f in out.decode("utf-8", "surrogateescape").split("\0") if f]
        kinds: dict[str, Literal["added", "deleted", "modified"]] = {}
        for code, name in zip(fields[::2], fields[1::2], strict=False):
            kinds[name] = "added" if code == "A" else "deleted" if code == "D" else "modified"
        return kinds

    def _store(self, work: Path) -> Path:
        key = hashlib.sha256(os.fsencode(os.path.abspath(work))).hexdigest()[:24]
        return self.root / key

    async def _ensure(self, work: Path) -> bool:
        """Create the store unless it exists; whether it existed."""
        store = self._store(work)
        if await self._blocking((store / "index").exists):
            return True
        await self._blocking(functools.partial(os.makedirs, store, exist_ok=True))
        await self._git(work, "init", "--quiet")
        for key, value in (
            ("core.autocrlf", "false"),
            ("core.safecrlf", "false"),
            ("core.quotepath", "false"),
            ("core.symlinks", "true"),
            ("core.fsmonitor", "false"),
            ("gc.auto", "0"),
            # Untracked-file scans skip directories whose mtime did not change,
            # and the index is the compact v4 format: what keeps an incremental
            # snapshot near a plain ``git status``.
            ("core.untrackedCache", "true"),
            ("index.version", "4"),
            ("core.preloadIndex", "true"),
        ):
            await self._git(work, "config", key, value)
        await self._blocking(self._write_exclude, work, store)
        return False

    def _write_exclude(self, work: Path, store: Path) -> None:
        lines = []
        real = os.path.realpath(work)
        for path in self._exclude:
            rel = os.path.relpath(os.path.realpath(path), real)
            if not rel.startswith(".."):
                lines.append("/" + rel.replace(os.sep, "/") + "/")
        info = store / "info"
        info.mkdir(exist_ok=True)
        (info / "exclude").write_text("".join(f"{line}\n" for line in lines))

    async def _git(self, work: Path, *args: str, check: bool = True) -> bytes:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_DIR": str(self._store(work)),
            "GIT_WORK_TREE": str(work),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_LITERAL_PATHSPECS": "1",
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_AUTHOR_NAME": "sessionrt",
            "GIT_AUTHOR_EMAIL": "sessionrt@localhost",
            "GIT_COMMITTER_NAME": "sessionrt",
            "GIT_COMMITTER_EMAIL": "sessionrt@localhost",
            "LC_ALL": "C",
        }
        proc = await asyncio.create_subprocess_exec(
            "git",
            *args,
            cwd=work,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await proc.communicate()
        except BaseException:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            raise
        if check and proc.returncode != 0:
            raise SnapshotError(f"git {args[0]} failed: {err.decode(errors='replace').strip()}")
        return out


def _in_git_work_tree(work: Path) -> bool:
    return any((candidate / ".git").exists() for candidate in (work, *work.parents))


def _confine_all(work: Path, names: Sequence[str]) -> str:
    base = os.path.realpath(work)
    for name in names:
        _confine(base, name)
    return base


def _confine(base: str, name: str) -> None:
    if not name or os.path.isabs(name):
        raise SnapshotError(f"refusing path {name!r}")
    parent = os.path.realpath(os.path.join(base, os.path.dirname(name)))
    if parent != base and not parent.startswith(base + os.sep):
        raise SnapshotError(f"refusing path {name!r}: it leaves the directory")


def _remove(base: str, names: Sequence[str]) -> None:
    for name in names:
        path = os.path.join(base, name)
        if (os.path.lexists(path) and not os.path.isdir(path)) or os.path.islink(path):
            os.unlink(path)
        # Directories left empty by the removal go too, up to the base.
        parent = os.path.dirname(path)
        while parent != base and parent.startswith(base + os.sep):
            try:
                os.rmdir(parent)
            except OSError:
                break
            parent = os.path.dirname(parent)
