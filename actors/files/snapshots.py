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

A full ``git add --all`` still stats every file (about a ``git status``), and
a bash step would need two. So each tree also has a :class:`~actors.files.watch.TreeWatch`
(inotify) that lists the paths changed since the index was last brought up to
date; git is then told only those (``git add --all -- <paths>``), and a step
that changed nothing runs no git at all. The watch is a shortcut, never the
truth: whenever it cannot vouch for its list (overflow, limits, a changed
``.gitignore``, no inotify) the snapshot is the full scan, and it is trusted
only after a full scan that started once all its watches were in place. Up
to ``MAX_WATCHED_TREES`` trees are watched; :meth:`Snapshots.aclose` closes them.

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
only while used (:class:`_StoreLocks`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import os
import re
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal

import attrs

from actors.files.confined import ConfinedDir, Entry, Kind, Refused, apply_entries, check_entries
from actors.files.snapshot_blobs import BlobError, BlobReader
from actors.files.watch import MAX_DIRTY, MAX_WATCHES, TreeWatch, collapse, open_watch
from protocol.shapes import FileDiff

__all__ = [
    "WRITING_TOOLS",
    "Blocking",
    "Recorded",
    "RestoreRefused",
    "SnapshotError",
    "Snapshots",
    "StepWrites",
]


class _StoreLocks:
    """One lock per snapshot store (one git index), kept only while held or awaited."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, name: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(name) or (asyncio.Lock(), 0)
        self._locks[name] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[name]
            if users == 1:
                del self._locks[name]
            else:
                self._locks[name] = (lock, users - 1)


log = logging.getLogger(__name__)

Blocking = Callable[..., Awaitable[Any]]

#: Tools whose call may change files: a step that runs one takes snapshots.
WRITING_TOOLS: Final = frozenset({"write", "edit", "bash"})
#: Bytes of one file's patch kept in a diff; longer patches are cut there.
MAX_PATCH_BYTES: Final = 256 * 1024
#: Files a diff reports at most (each costs one git call).
MAX_DIFF_FILES: Final = 1000
#: Stores whose last written tree is remembered (to skip a ``write-tree``).
MAX_CACHED_TREES: Final = 1024
#: Work trees watched at once (each one inotify descriptor, up to ``MAX_WATCHES`` watches).
MAX_WATCHED_TREES: Final = 16
#: A tree id of the store (SHA-1 or SHA-256 object names).
_TREE_ID: Final = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
#: Bumped when the store's configuration changes: older stores get the new one.
_CONFIG_VERSION: Final = "3"
_CONFIG: Final = (
    ("core.autocrlf", "false"),
    ("core.safecrlf", "false"),
    ("core.quotepath", "false"),
    ("core.symlinks", "true"),
    ("core.fsmonitor", "false"),
    ("gc.auto", "0"),
    # Untracked-file scans skip directories whose mtime did not change, the
    # index is the compact v4 format, stat refreshes run in parallel, and an
    # index write stores only the entries changed since the shared index:
    # what keeps a snapshot on a large tree cheap.
    ("core.untrackedCache", "true"),
    ("index.version", "4"),
    ("core.preloadIndex", "true"),
    ("core.splitIndex", "true"),
    ("splitIndex.maxPercentChange", "20"),
    # The entry offset table lets every git read the (10,000-entry) index on
    # two threads: about a tenth off each of a step's git processes.
    ("index.threads", "true"),
    ("index.recordOffsetTable", "true"),
    ("index.recordEndOfIndexEntries", "true"),
    ("advice.addIgnoredFile", "false"),
)
#: A tree entry's mode -> what a restore makes of it (anything else: a plain file).
_KINDS: Final[dict[str, Kind]] = {"100644": "file", "100755": "exec", "120000": "link"}


@attrs.frozen(kw_only=True)
class Recorded:
    """A writing step's snapshots: the trees before and after it, the paths it changed."""

    before: str
    after: str
    files: tuple[str, ...]


class SnapshotError(Exception):
    """git failed (the environment broke it): the message carries git's stderr."""


class RestoreRefused(SnapshotError):
    """A restore that would leave the directory, touch the data dir, or lose a file.

    ``changed``: it was refused half way and the files could not all be put
    back (otherwise they are as they were before it).
    """

    def __init__(self, message: str, *, changed: bool = False) -> None:
        super().__init__(message)
        self.changed = changed


class Snapshots:
    def __init__(
        self,
        root: Path,
        *,
        exclude: Sequence[Path] = (),
        blocking: Blocking = asyncio.to_thread,
        watch: bool = True,
        max_watches: int = MAX_WATCHES,
        max_dirty: int = MAX_DIRTY,
    ) -> None:
        #: Where the stores live: ``<data dir>/snapshot``.
        self.root = root
        #: Runs the few blocking file-system calls (stats, the exclude file, removals):
        #: the runtime's bounded BlockingExecutor, never the loop's default pool.
        self._blocking = blocking
        #: Server directories never captured even if they lie inside a project.
        self._exclude = tuple(exclude)
        self._locks = _StoreLocks()
        #: Store name -> (the tree last written from its index, that index's stat).
        self._trees: OrderedDict[str, tuple[str, tuple[int, int, int]]] = OrderedDict()
        #: Whether change tracking (inotify) is tried at all; off, every bash step scans.
        self._watching = watch
        self._max_watches = max_watches
        self._max_dirty = max_dirty
        #: Store name -> the tree's watch (None: it cannot be watched), for at most
        #: ``MAX_WATCHED_TREES`` trees; the least recently used is closed beyond it.
        self._watches: OrderedDict[str, TreeWatch | None] = OrderedDict()
        #: Work trees known to be in a git work tree and stores known to have
        #: their index (at most ``MAX_CACHED_TREES`` keys): no stat for them.
        self._known: OrderedDict[str, None] = OrderedDict()

    # -- the public operations ------------------------------------------------------------------

    async def track(self, directory: str | Path, paths: Sequence[str] | None = None) -> str | None:
        """Snapshot ``directory`` now; its tree id, or None outside a git work tree.

        With ``paths``, only those are looked at: everything else is as the
        previous snapshot left it in the store's index. A full look (``paths``
        None) costs about a ``git status``.
        """
        work = Path(directory)
        if not await self._in_git(work):
            return None
        async with self._locks.hold(self._store(work).name):
            if not await self._ensure(work):
                paths = None  # a new store has no index to build on
            await self._refresh(work, paths)
            return await self._tree(work)

    async def prepare(
        self, directory: str | Path, paths: Sequence[str] | None, exclude: Sequence[str] = ()
    ) -> bool:
        """Bring the store's index up to date before a writing call may change files.

        ``paths`` (a write/edit call's path) or, with None (a bash call), the
        whole directory but ``exclude`` (the paths earlier calls of the step
        may already have changed). No tree is written: the index itself is the
        step's "before", made a tree by :meth:`record` only when the step ends.
        False outside a git work tree.
        """
        work = Path(directory)
        if not await self._in_git(work):
            return False
        async with self._locks.hold(self._store(work).name):
            if not await self._ensure(work):
                paths, exclude = None, ()  # a new store has no index to build on
            await self._refresh(work, paths, exclude, establish=True)
        return True

    async def record(self, directory: str | Path, paths: Sequence[str] | None) -> Recorded | None:
        """The step's snapshots: the index made a tree (before), then refreshed (after).

        Call after :meth:`prepare` ran before each of the step's writing calls;
        ``paths`` as for :meth:`track`. None if the store does not exist.
        """
        work = Path(directory)
        async with self._locks.hold(self._store(work).name):
            if not await self._has_index(work):
                return None
            before = await self._tree(work)
            changed = await self._refresh(work, paths)
            after = before if changed == () else await self._tree(work)
            if changed is None:
                changed = await self._changed(work, before, after)
        return Recorded(before=before, after=after, files=tuple(sorted(set(changed))))

    async def changed(self, directory: str | Path, a: str, b: str) -> tuple[str, ...]:
        """Paths that differ between trees ``a`` and ``b``, sorted."""
        return await self._changed(Path(directory), a, b)

    async def restore(
        self,
        directory: str | Path,
        restores: Sequence[tuple[str, Sequence[str]]],
        *,
        undo: str | None = None,
    ) -> None:
        """Make each path of ``restores`` (tree, paths) what it is in its tree, bytes and mode.

        A path its tree does not have is deleted. Every file operation is
        confined to ``directory`` when it is made (:mod:`actors.files.confined`):
        nothing is followed through a symlink, the data dir is never touched,
        symlinks are made last. A plan that cannot be carried out whole is
        refused (:class:`RestoreRefused`) before anything changes; one refused
        half way (the tree changed under it) puts the paths it touched back
        as they are in ``undo`` (the tree taken just before) and is refused.
        """
        work = Path(directory)
        plan = [(tree, sorted(set(paths))) for tree, paths in restores if paths]
        if not plan:
            return
        name = self._store(work).name
        async with self._locks.hold(name):
            entries: dict[str, Entry] = {}
            for tree, paths in plan:
                entries.update(await self._entries(work, tree, paths))
            back = None if undo is None else await self._entries(work, undo, sorted(entries))
            forbidden = (*self._exclude, self.root)
            try:
                await self._blocking(_restore, str(work), forbidden, self._env(work), entries, back)
            except Refused as exc:
                raise RestoreRefused(str(exc), changed=exc.changed) from None
            finally:
                # The files changed under the index: bring it along (git only reads them).
                self._trees.pop(name, None)
                with contextlib.suppress(SnapshotError):
                    await self._refresh_paths(work, sorted(entries), ())

    async def has_trees(self, directory: str | Path, trees: Sequence[str]) -> bool:
        """Whether the store of ``directory`` holds every one of ``trees``."""
        work = Path(directory)
        if not trees:
            return True
        if not all(_TREE_ID.fullmatch(tree) for tree in trees):
            return False  # never handed to git: it could read as an option
        if not await self._blocking((self._store(work) / "objects").is_dir):
            return False
        for tree in sorted(set(trees)):
            out = await self._git(work, "cat-file", "-t", tree, check=False, retry=False)
            if out.strip() != b"tree":
                return False
        return True

    async def _entries(self, work: Path, tree: str, paths: Sequence[str]) -> dict[str, Entry]:
        """What each of ``paths`` is in ``tree``: file, executable, symlink, or absent."""
        listed = await self._git(work, "ls-tree", "-r", "-z", "--full-tree", tree, "--", *paths)
        wanted = set(paths)
        out = {p: Entry(kind=None) for p in paths}
        for line in listed.decode("utf-8", "surrogateescape").split("\0"):
            if not line:
                continue
            meta, _, path = line.partition("\t")
            mode, kind, oid = meta.split(" ")
            if path not in wanted or kind != "blob":
                continue  # a gitlink (submodule) is never checked out; below a path: not asked
            out[path] = Entry(kind=_KINDS.get(mode, "file"), oid=oid)
        return out

    async def diff(
        self,
        directory: str | Path,
        a: str,
        b: str,
        *,
        context: int = 3,
        only: Collection[str] | None = None,
    ) -> list[FileDiff]:
        """File diffs from tree ``a`` to tree ``b`` (at most ``MAX_DIFF_FILES`` files).

        Both are trees of the store (git reads its objects, never the files of
        the directory), named by their ids: anything else is a
        :class:`SnapshotError` before git runs. ``only``: just those paths.
        """
        work = Path(directory)
        for tree in (a, b):
            if not _TREE_ID.fullmatch(tree):
                raise SnapshotError(f"not a snapshot id: {tree[:80]!r}")
        out = await self._git(work, "diff", "--no-renames", "--numstat", "-z", a, b)
        result: list[FileDiff] = []
        status = await self._statuses(work, a, b)
        for entry in out.decode("utf-8", "surrogateescape").split("\0"):
            if not entry:
                continue
            added, deleted, name = entry.split("\t", 2)
            if only is not None and name not in only:
                continue
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

    async def _changed(self, work: Path, a: str, b: str) -> tuple[str, ...]:
        if a == b:
            return ()
        out = await self._git(work, "diff", "--name-only", "-z", "--no-renames", a, b)
        return tuple(sorted(p for p in out.decode("utf-8", "surrogateescape").split("\0") if p))

    async def _refresh(
        self,
        work: Path,
        paths: Sequence[str] | None,
        exclude: Sequence[str] = (),
        *,
        establish: bool = False,
    ) -> tuple[str, ...] | None:
        """Update the index from the files; the paths whose entry changed (None: unknown).

        With the tree's watch trusted, git is told only what the watch saw
        change (for ``paths``: those of them it saw change; nothing changed,
        no git at all). Otherwise ``paths`` None is a full scan (which makes
        the watch trusted), and named ``paths`` are refreshed as named; with
        ``establish`` (a step's ``prepare``) an untrusted watch gets its full
        scan now, ``exclude`` left as it is, so the step's later calls are cheap.
        """
        watch = await self._watch_for(work)
        if watch is not None:
            changed = await watch.changes(self._blocking)
            if changed is not None:
                return await self._refresh_listed(work, watch, changed, paths, exclude)
        if paths is None or (establish and watch is not None):
            return await self._refresh_full(work, watch, exclude)
        return await self._refresh_paths(work, await self._inside(work, paths), ())

    async def _refresh_listed(
        self,
        work: Path,
        watch: TreeWatch,
        changed: frozenset[str],
        paths: Sequence[str] | None,
        exclude: Sequence[str],
    ) -> tuple[str, ...] | None:
        """Refresh what the watch saw change (of ``paths``, if named), ``exclude`` kept."""
        kept = set(await self._inside(work, exclude))
        if paths is None:
            take = [p for p in collapse(changed) if p not in kept]
        else:
            take = [p for p in await self._inside(work, paths) if _covered(p, changed)]
        if not take:
            return ()
        tops = set(take)
        # Everything under what git is told now is covered by it but ``kept``,
        # which stays (or becomes: the watch may never have seen it) changed.
        held = [k for k in kept if _covered(k, tops)]
        watch.discard([p for p in changed if p not in kept and _covered(p, tops)])
        watch.mark(held)
        try:
            return await self._refresh_paths(work, take, held, watch=watch)
        except BaseException:
            watch.distrust("a listed refresh did not finish")
            raise

    async def _refresh_full(
        self, work: Path, watch: TreeWatch | None, exclude: Sequence[str]
    ) -> tuple[str, ...] | None:
        """``git add --all`` of the whole tree (but ``exclude``); the watch trusted after it."""
        if watch is not None and not watch.reusable:
            watch = await self._rewatch(work, watch)
        excluded = await self._inside(work, exclude)
        if watch is not None:
            watch.begin_full(keep=excluded)
        specs = [".", *(f":(exclude,literal){p}" for p in excluded)]
        out = await self._git(
            work,
            "add",
            "--all",
            "--verbose",
            "--ignore-errors",
            "--",
            *specs,
            check=False,
            literal=False,
        )
        if watch is not None:
            watch.end_full()
        return _verbose_paths(out, ("add", "remove"))

    async def _refresh_paths(
        self,
        work: Path,
        inside: Sequence[str],
        exclude: Sequence[str],
        *,
        watch: TreeWatch | None = None,
    ) -> tuple[str, ...] | None:
        """Refresh the named paths (files or whole directories), ``exclude`` kept.

        ``git add --all --verbose`` names each entry it changes, so no diff
        is needed after it. A named path that does not exist (a file a write
        is about to create, or one deleted) is dropped from the index, with
        what was under it, by ``git rm --cached -r`` instead: ``git add``
        refuses the whole call for a path that matches nothing. The
        ``.gitignore`` is honoured either way.
        """
        if not inside:
            return ()
        present = await self._blocking(_present, work, inside)
        missing = [p for p in inside if p not in present]
        found: list[str] = []
        skip = [f":(exclude,literal){p}" for p in exclude]
        for argv, verbs, names in (
            (("add", "--all", "--verbose", "--ignore-errors"), ("add", "remove"), present),
            (("rm", "--cached", "-r", "--ignore-unmatch"), ("rm",), missing),
        ):
            if not names:
                continue
            specs = [*(f":(literal){p}" for p in names), *skip] if skip else list(names)
            try:
                out = await self._git(work, *argv, "--", *specs, check=False, literal=not skip)
            except SnapshotError:
                # git refused a path (beyond a symlink, inside a nested
                # repository) and with it the call: a full look still gets
                # every change.
                return await self._refresh_full(work, watch, exclude)
            listed = _verbose_paths(out, verbs)
            if listed is None:
                return None
            found.extend(listed)
        return tuple(found)

    async def _watch_for(self, work: Path) -> TreeWatch | None:
        """The tree's watch (opened on first use); None if it cannot be watched."""
        if not self._watching:
            return None
        name = self._store(work).name
        if name in self._watches:
            self._watches.move_to_end(name)
            watch = self._watches[name]
            if watch is not None and (watch.closed or watch.broken is not None):
                log.info("watch of %s lost (%s): full scans", work, watch.broken)
                watch.close()
                self._watches[name] = watch = None
            return watch
        return await self._rewatch(work, None)

    async def _rewatch(self, work: Path, old: TreeWatch | None) -> TreeWatch | None:
        """A fresh watch for ``work`` in place of ``old`` (closed); None if none can be had."""
        name = self._store(work).name
        if old is not None:
            log.info("re-watching %s: %s", work, old.doubt)
            old.close()
        root, skip = await self._blocking(self._watch_spec, work)
        watch = await open_watch(
            root,
            self._blocking,
            skip=skip,
            max_watches=self._max_watches,
            max_dirty=self._max_dirty,
        )
        self._watches[name] = watch
        self._watches.move_to_end(name)
        while len(self._watches) > MAX_WATCHED_TREES:
            _, evicted = self._watches.popitem(last=False)
            if evicted is not None:
                evicted.close()
        return watch

    def _watch_spec(self, work: Path) -> tuple[str, list[str]]:
        """``work`` absolute, and the server's directories inside it (relative): never watched."""
        real = os.path.realpath(work)
        out = []
        for path in (*self._exclude, self.root):
            rel = os.path.relpath(os.path.realpath(path), real)
            if rel != "." and not rel.startswith(".."):
                out.append(rel.replace(os.sep, "/"))
        return os.path.abspath(work), out

    async def aclose(self) -> None:
        """Close every watch (their descriptors and readers): the host is shutting down."""
        watches, self._watches = list(self._watches.values()), OrderedDict()
        for watch in watches:
            if watch is not None:
                watch.close()

    async def _inside(self, work: Path, paths: Sequence[str]) -> list[str]:
        """``paths`` relative to ``work``, those outside it (or naming it) left out.

        Only string arithmetic (``work`` is absolute: no ``getcwd``), so on the loop.
        """
        if not paths:
            return []
        return _relative_inside(work, paths)

    async def _in_git(self, work: Path) -> bool:
        """Whether ``work`` is in a git work tree; a yes is remembered (bounded)."""
        key = str(work)
        if key in self._known:
            self._known.move_to_end(key)
            return True
        if not await self._blocking(_in_git_work_tree, work):
            return False
        self._remember(key)
        return True

    async def _has_index(self, work: Path) -> bool:
        store = self._store(work)
        if store.name in self._known:
            return True
        return bool(await self._blocking((store / "index").exists))

    def _remember(self, key: str) -> None:
        self._known[key] = None
        self._known.move_to_end(key)
        while len(self._known) > MAX_CACHED_TREES:
            self._known.popitem(last=False)

    async def _tree(self, work: Path) -> str:
        """The index as a tree; the last one written while the index is unchanged.

        ``write-tree`` reuses the index's cache-tree for every directory the
        refresh did not touch; when nothing changed at all (the index file is
        the one the tree was written from, same inode, size and mtime), no git
        runs. Kept per store, for at most ``MAX_CACHED_TREES`` stores.
        """
        store = self._store(work)
        index = await self._blocking(_index_stat, store)
        cached = self._trees.get(store.name)
        if cached is not None and index is not None and cached[1] == index:
            self._trees.move_to_end(store.name)
            return cached[0]
        tree = (await self._git(work, "write-tree")).decode().strip()
        index = await self._blocking(_index_stat, store)
        if index is not None:
            self._trees[store.name] = (tree, index)
            self._trees.move_to_end(store.name)
            while len(self._trees) > MAX_CACHED_TREES:
                self._trees.popitem(last=False)
        return tree

    def _store(self, work: Path) -> Path:
        key = hashlib.sha256(os.fsencode(os.path.abspath(work))).hexdigest()[:24]
        return self.root / key

    async def _ensure(self, work: Path) -> bool:
        """Create (or re-configure) the store; whether it had an index already.

        A store seen with its index in this process is taken as still there
        (``_known``): two file reads fewer for each of a step's calls.
        """
        store = self._store(work)
        if store.name in self._known:
            self._known.move_to_end(store.name)
            return True
        existed = await self._ensure_store(work, store)
        if existed:  # as read by _ensure_store (``git init`` writes no index)
            self._remember(store.name)
        return existed

    async def _ensure_store(self, work: Path, store: Path) -> bool:
        marker = store / "sessionrt-config"
        if await self._blocking(_read_text, marker) == _CONFIG_VERSION:
            return bool(await self._blocking((store / "index").exists))
        existed = bool(await self._blocking((store / "index").exists))
        await self._blocking(functools.partial(os.makedirs, store, exist_ok=True))
        if not existed:
            await self._git(work, "init", "--quiet")
        for key, value in _CONFIG:
            await self._git(work, "config", key, value)
        await self._blocking(self._write_exclude, work, store)
        await self._blocking(marker.write_text, _CONFIG_VERSION)
        return existed

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

    def _env(self, work: Path, *, literal: bool = True) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_DIR": str(self._store(work)),
            "GIT_WORK_TREE": str(work),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            # Named paths are never pathspec magic (``:(exclude,literal)`` is ours).
            "GIT_LITERAL_PATHSPECS": "1" if literal else "0",
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_AUTHOR_NAME": "sessionrt",
            "GIT_AUTHOR_EMAIL": "sessionrt@localhost",
            "GIT_COMMITTER_NAME": "sessionrt",
            "GIT_COMMITTER_EMAIL": "sessionrt@localhost",
            "LC_ALL": "C",
        }

    async def _git(
        self,
        work: Path,
        *args: str,
        check: bool = True,
        literal: bool = True,
        retry: bool = True,
    ) -> bytes:
        env = self._env(work, literal=literal)
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
                await asyncio.shield(proc.wait())
                # It may have died holding the index lock; we hold the store's
                # lock, so no other git of ours is using it.
                await self._blocking(_unlink_lock, self._store(work))
            raise
        if proc.returncode and b"index.lock" in err and retry:
            # A git killed by a crash left its lock: nobody else uses the store.
            await self._blocking(_unlink_lock, self._store(work))
            return await self._git(work, *args, check=check, literal=literal, retry=False)
        # Without ``check`` only a fatal error (128: nothing was done) raises.
        code = proc.returncode or 0
        if code != 0 and (check or code >= 128):
            raise SnapshotError(f"git {args[0]} failed: {err.decode(errors='replace').strip()}")
        return out


def _verbose_paths(out: bytes, verbs: Sequence[str]) -> tuple[str, ...] | None:
    """The paths of git's ``<verb> '<path>'`` lines; None if a line is not one.

    (A path with a newline in it, say: the caller then asks ``git diff``.)
    """
    found = []
    for line in out.decode("utf-8", "surrogateescape").splitlines():
        verb, _, rest = line.partition(" ")
        if verb not in verbs or len(rest) < 2 or rest[0] != "'" or rest[-1] != "'":
            return None
        found.append(rest[1:-1])
    return tuple(found)


def _covered(path: str, tops: frozenset[str] | set[str]) -> bool:
    """Whether ``path`` is one of ``tops`` or lies under one ("" covers all)."""
    if path in tops or "" in tops:
        return True
    cut = path.rfind("/")
    while cut > 0:
        if path[:cut] in tops:
            return True
        cut = path.rfind("/", 0, cut)
    return False


def _relative_inside(work: Path, paths: Sequence[str]) -> list[str]:
    base = os.path.abspath(work)
    out = []
    for path in paths:
        full = os.path.normpath(os.path.join(base, path))
        if full.startswith(base + os.sep):
            out.append(os.path.relpath(full, base).replace(os.sep, "/"))
    return sorted(set(out))


def _present(work: Path, paths: Sequence[str]) -> list[str]:
    return [p for p in paths if os.path.lexists(os.path.join(work, p))]


def _index_stat(store: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(store / "index")
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _unlink_lock(store: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(store / "index.lock")


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _in_git_work_tree(work: Path) -> bool:
    return any((candidate / ".git").exists() for candidate in (work, *work.parents))


def _restore(
    base: str,
    forbidden: Sequence[Path],
    env: Mapping[str, str],
    entries: Mapping[str, Entry],
    back: Mapping[str, Entry] | None,
) -> None:
    """The restore's file work, on a thread: check, apply; on a refusal, put back.

    Every failure is a :class:`Refused` saying whether the files may have changed.
    """
    try:
        with ConfinedDir(base, map(str, forbidden)) as tree, BlobReader(env, base) as blobs:
            check_entries(tree, entries)
            touched: list[str] = []
            try:
                apply_entries(tree, entries, blobs.copy, blobs.read, touched)
            except (Refused, OSError, BlobError) as exc:
                if not touched:
                    raise
                if back is None:
                    raise Refused(str(exc), changed=True) from None
                try:
                    apply_entries(tree, {p: back[p] for p in touched}, blobs.copy, blobs.read)
                except (Refused, OSError, BlobError) as again:
                    why = f"{exc}; putting the files back failed too: {again}"
                    raise Refused(why, changed=True) from None
                raise Refused(f"{exc} (the files it had changed are back)") from None
    except (OSError, BlobError) as exc:
        raise Refused(f"restore failed: {exc}") from None


class StepWrites:
    """One step's snapshots, taken lazily around its writing calls.

    Nothing runs for a step that writes nothing. Just before each writing
    call runs, :meth:`before_run` brings the store's index up to date for
    what that call may change: a write/edit call's path (unless an earlier
    call of the step already did), or for the step's first bash call the
    whole directory but the paths earlier calls may have written. Once a
    bash call has started, every path is covered. The index then holds each
    path as it was before the step first touched it, so :meth:`record`
    writes it as the "before" tree when the step ends, then refreshes and
    writes the "after". A failing store costs the step its snapshot, never
    the step.
    """

    def __init__(self, snapshots: Snapshots, directory: str) -> None:
        self._snapshots = snapshots
        self._directory = directory
        self._lock = asyncio.Lock()
        self._paths: set[str] = set()
        self._whole = False
        #: None: no writing call yet; False: no snapshot (no git work tree, a failure).
        self._ok: bool | None = None

    async def before_run(self, tool: str, input: Mapping[str, Any]) -> None:
        if tool not in WRITING_TOOLS:
            return
        async with self._lock:
            if self._ok is False or self._whole:
                return
            path = input.get("path")
            if tool != "bash" and (not isinstance(path, str) or path in self._paths):
                return
            try:
                if tool == "bash":
                    ok = await self._snapshots.prepare(
                        self._directory, None, exclude=sorted(self._paths)
                    )
                    self._whole = True
                else:
                    assert isinstance(path, str)
                    ok = await self._snapshots.prepare(
                        self._directory, [path], exclude=sorted(self._paths)
                    )
                    self._paths.add(path)
            except Exception as exc:
                log.warning("snapshot of %s failed: %s", self._directory, exc)
                ok = False
            self._ok = ok

    async def record(self) -> Recorded | None:
        """The step's before/after trees and changed files; None if it took none."""
        async with self._lock:
            if not self._ok:
                return None
            try:
                return await self._snapshots.record(
                    self._directory, None if self._whole else sorted(self._paths)
                )
            except Exception as exc:
                log.warning("snapshot of %s failed: %s", self._directory, exc)
                return None
