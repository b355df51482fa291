"""Which paths of a work tree changed since the last snapshot, from Linux inotify.

A bash step cannot say which files its shell touched, so without help every
bash step pays two full ``git add --all`` scans of the tree (about 2.5x a
``git status``). A :class:`TreeWatch` keeps an inotify watch on every
directory of one work tree and collects the paths the kernel reports as
created, written, chmod-ed, deleted or renamed; a snapshot then hands git only
those paths. It is only ever a shortcut: whenever the watch cannot vouch for
its list, :meth:`TreeWatch.changes` answers None and the caller does the full
scan, so a snapshot is always what a full scan would have produced:

- the kernel's queue overflowed (``IN_Q_OVERFLOW``), the collected set grew
  past ``max_dirty`` paths, the root itself was deleted or moved, a watch
  could not be added (the per-user limit, ``ENOSPC``), or more than
  ``max_watches`` directories would be watched;
- a ``.gitignore`` or a nested ``.git`` appeared, changed or went away: the
  directory holding it is rescanned as a whole (the root: a full scan);
- the watch has not yet been through a full scan that started after all its
  watches were in place (:meth:`begin_full`/:meth:`end_full`).

New directories are race-free: a directory that appears is marked changed as
a whole (git rescans it) and watched, each directory's watch added *before*
it is listed, so a file made in it is either seen by that listing's later
git scan or reported by the watch. Listing and watching run in the blocking
executor, never on the loop; events are read on the loop (``add_reader``),
parsed and folded into the set under a lock the walker shares.

Not seen by inotify, so not by this (documented in the README): writes
through a shared ``mmap`` and writes through a hard link from outside the
tree, and changes on a network file system made by another machine. Every
other change reaches git as it would through a full scan.

No dependency: ctypes on libc's ``inotify_init1``/``inotify_add_watch``.
Off Linux (or with inotify unavailable) :func:`open_watch` answers None and
every snapshot does the full scan, as before.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import errno
import logging
import os
import struct
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any, Final

__all__ = [
    "WATCH_MASK",
    "TreeWatch",
    "collapse",
    "inotify_lib",
    "new_inotify",
    "open_watch",
    "parse_events",
    "read_queued",
]

log = logging.getLogger(__name__)

IN_MODIFY: Final = 0x2
IN_ATTRIB: Final = 0x4
IN_CLOSE_WRITE: Final = 0x8
IN_MOVED_FROM: Final = 0x40
IN_MOVED_TO: Final = 0x80
IN_CREATE: Final = 0x100
IN_DELETE: Final = 0x200
IN_DELETE_SELF: Final = 0x400
IN_MOVE_SELF: Final = 0x800
IN_Q_OVERFLOW: Final = 0x4000
IN_IGNORED: Final = 0x8000
IN_ONLYDIR: Final = 0x1000000
IN_DONT_FOLLOW: Final = 0x2000000
IN_ISDIR: Final = 0x40000000
_IN_NONBLOCK: Final = os.O_NONBLOCK
_IN_CLOEXEC: Final = 0o2000000

_MASK: Final = (
    IN_MODIFY
    | IN_ATTRIB
    | IN_CLOSE_WRITE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
    | IN_ONLYDIR
    | IN_DONT_FOLLOW
)
_HEADER: Final = struct.Struct("iIII")

#: Directories one tree's watch covers at most; beyond it the tree is full-scanned.
MAX_WATCHES: Final = 16_384
#: Changed paths one watch collects at most between snapshots; beyond it, a full scan.
MAX_DIRTY: Final = 4_096

Blocking = Callable[..., Awaitable[Any]]
_FRESH: Final = "not yet scanned"


class _Libc:
    def __init__(self) -> None:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        self.init1 = lib.inotify_init1
        self.init1.argtypes = [ctypes.c_int]
        self.init1.restype = ctypes.c_int
        self.add_watch = lib.inotify_add_watch
        self.add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self.add_watch.restype = ctypes.c_int
        self.rm_watch = lib.inotify_rm_watch
        self.rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        self.rm_watch.restype = ctypes.c_int


_libc: _Libc | None = None


def _lib() -> _Libc:
    global _libc
    if _libc is None:
        _libc = _Libc()
    return _libc


def new_inotify() -> int:
    """A new non-blocking, close-on-exec inotify descriptor (the caller closes it).

    Raises OSError when libc has no inotify or the kernel refuses one.
    """
    fd: int = _lib().init1(_IN_NONBLOCK | _IN_CLOEXEC)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return fd


def read_queued(fd: int) -> bytes:
    """Every event queued on non-blocking inotify ``fd`` now (``b""``: none).

    Raises OSError when the descriptor cannot be read.
    """
    chunks = []
    while True:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks)


def parse_events(data: bytes) -> Iterator[tuple[int, int, str]]:
    """``(watch descriptor, mask, name)`` of each inotify event in ``data`` (one read)."""
    offset = 0
    while offset + _HEADER.size <= len(data):
        wd, mask, _cookie, size = _HEADER.unpack_from(data, offset)
        offset += _HEADER.size
        yield wd, mask, os.fsdecode(data[offset : offset + size].rstrip(b"\0"))
        offset += size


#: libc's inotify calls (loaded on first use), for other watchers in this package.
inotify_lib: Final = _lib
#: What a directory watch reports (see :data:`_MASK`).
WATCH_MASK: Final = _MASK


def collapse(paths: Iterable[str]) -> list[str]:
    """``paths`` sorted, without those inside another one of them ("" holds all)."""
    out: list[str] = []
    for path in sorted(set(paths), key=lambda p: p.split("/")):
        if out and (out[-1] == "" or path == out[-1] or path.startswith(out[-1] + "/")):
            continue
        out.append(path)
    return out


def _under(path: str, top: str) -> bool:
    return top == "" or path == top or path.startswith(top + "/")


class TreeWatch:
    """The paths changed under ``root`` since they were last taken; see the module doc.

    Paths are relative to ``root`` with ``/`` separators; "" stands for the
    whole tree. ``skip`` are relative directories never watched nor reported
    (the server's own directories, which the store ignores anyway).
    """

    def __init__(
        self,
        root: str,
        fd: int,
        *,
        skip: Iterable[str] = (),
        max_watches: int = MAX_WATCHES,
        max_dirty: int = MAX_DIRTY,
    ) -> None:
        self.root = root
        self._fd: int | None = fd
        self._skip = frozenset(skip)
        self._max_watches = max_watches
        self._max_dirty = max_dirty
        #: Shared by the loop (events) and the walker thread (new watches).
        self._lock = threading.Lock()
        self._paths: dict[int, str] = {}
        self._wds: dict[str, int] = {}
        self._dirty: set[str] = set()
        #: New directories still to be watched and listed (bounded by ``max_dirty``).
        self._pending: list[str] = []
        #: Why the list cannot be trusted until the next full scan (None: it can).
        self._doubt: str | None = _FRESH
        #: Why the tree cannot be watched at all any more (None: it can).
        self.broken: str | None = None
        self._reading = False
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read events on ``loop`` from now on (the owner calls :meth:`close`)."""
        assert self._fd is not None
        loop.add_reader(self._fd, self._drain)
        self._reading = True
        self._loop = loop

    def close(self) -> None:
        """Stop reading and close the inotify descriptor (its watches go with it)."""
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is None:
            return
        if self._reading and self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(fd)
            self._reading = False
        os.close(fd)

    @property
    def closed(self) -> bool:
        return self._fd is None

    # -- what a snapshot asks -------------------------------------------------------------------

    async def changes(self, blocking: Blocking) -> frozenset[str] | None:
        """The changed paths now (to hand to git), or None: do a full scan.

        Every event queued so far is read first, and every new directory is
        watched and listed, so nothing that happened before this call is
        missing from the answer. The caller takes what it hands to git with
        :meth:`discard` before the next ``await``.
        """
        self._drain()
        while self._pending and self._doubt is None and self.broken is None:
            with self._lock:
                pending, self._pending = collapse(self._pending), []
            await blocking(self._watch_dirs, pending)
            self._drain()
        if self._fd is None or self.broken is not None or self._doubt is not None:
            return None
        if "" in self._dirty:
            return None
        return frozenset(self._dirty)

    def discard(self, paths: Iterable[str]) -> None:
        """``paths`` are now being handed to git: collect them afresh from here."""
        with self._lock:
            self._dirty.difference_update(paths)

    def mark(self, paths: Iterable[str]) -> None:
        """Count ``paths`` as changed (the owner left them out of what git was told)."""
        with self._lock:
            for path in paths:
                self._mark(path)

    def distrust(self, why: str) -> None:
        """Something between the list and git went wrong: the next snapshot scans fully."""
        with self._lock:
            self._doubt = why

    @property
    def doubt(self) -> str | None:
        return self._doubt

    @property
    def reusable(self) -> bool:
        """Whether a full scan can make this watch trusted again (its watches are whole).

        After an overflow, a lost event or a failed scan some directory may
        lack its watch: the owner opens a fresh watch instead.
        """
        return self._fd is not None and self.broken is None and self._doubt in (None, _FRESH)

    def begin_full(self, keep: Iterable[str] = ()) -> None:
        """A full scan starts now: everything before it is covered but ``keep``."""
        with self._lock:
            self._doubt = "full scan in progress"
            self._dirty = set(keep)

    def end_full(self) -> None:
        """The full scan that :meth:`begin_full` announced succeeded."""
        with self._lock:
            if self._doubt == "full scan in progress":
                self._doubt = None

    # -- watching -------------------------------------------------------------------------------

    def watch_all(self) -> None:
        """Watch every directory of the tree (blocking: run it in the executor)."""
        self._watch_dirs([""])

    def _watch_dirs(self, tops: list[str]) -> None:
        stack = list(reversed(tops))
        while stack:
            rel = stack.pop()
            full = os.path.join(self.root, rel) if rel else self.root
            if not self._add_watch(rel, full):
                continue
            try:
                with os.scandir(full) as entries:
                    for entry in entries:
                        if entry.name == ".git":
                            continue
                        child = f"{rel}/{entry.name}" if rel else entry.name
                        if child in self._skip:
                            continue
                        try:
                            if entry.is_dir(follow_symlinks=False):
                                stack.append(child)
                        except OSError:
                            continue
            except (FileNotFoundError, NotADirectoryError):
                continue  # gone again: its parent reported that
            except OSError as exc:
                # Unreadable: git cannot read it either, but a later chmod
                # must not go unseen; the owner scans fully instead.
                self.distrust(f"cannot list {rel!r}: {exc.strerror}")
                return

    def _add_watch(self, rel: str, full: str) -> bool:
        """Watch ``full``; False if it is gone or not a directory."""
        with self._lock:
            if self._fd is None:
                return False
            if len(self._paths) >= self._max_watches:
                self.broken = f"more than {self._max_watches} directories"
                return False
            # The root may itself be a symlink (the session's directory named
            # through one): followed. Below it a symlink is a file to git.
            mask = _MASK & ~IN_DONT_FOLLOW if rel == "" else _MASK
            wd = _lib().add_watch(self._fd, os.fsencode(full), mask)
            if wd < 0:
                err = ctypes.get_errno()
                if rel != "" and err in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                    return False
                self.broken = f"inotify_add_watch: {os.strerror(err)}"
                return False
            old = self._paths.get(wd)
            if old is not None and old != rel:
                # One directory under two names (a rename raced the walk).
                self._doubt = f"{rel!r} is also {old!r}"
            self._paths[wd] = rel
            self._wds[rel] = wd
            return True

    def _unwatch_under(self, top: str) -> None:
        """Forget the watches of ``top`` and below (it moved away; the lock is held)."""
        gone = [rel for rel in self._wds if _under(rel, top)]
        for rel in gone:
            wd = self._wds.pop(rel)
            self._paths.pop(wd, None)
            if self._fd is not None:
                _lib().rm_watch(self._fd, wd)

    # -- events ---------------------------------------------------------------------------------

    def _drain(self) -> None:
        """Read and fold in every queued event (non-blocking; on the loop)."""
        fd = self._fd
        if fd is None:
            return
        try:
            data = read_queued(fd)
        except OSError as exc:
            self.broken = f"reading inotify: {exc.strerror}"
            return
        if data:
            with self._lock:
                self._fold(data)

    def _fold(self, data: bytes) -> None:
        for wd, mask, name in parse_events(data):
            if mask & IN_Q_OVERFLOW:
                self._doubt = "the kernel's event queue overflowed"
                continue
            rel = self._paths.get(wd)
            if rel is None:
                # A watch being added by the walker, or one dropped: either
                # way inside a directory already marked changed as a whole.
                continue
            if mask & IN_IGNORED:
                self._paths.pop(wd, None)
                if self._wds.get(rel) == wd:
                    del self._wds[rel]
                if rel == "":
                    self._doubt = "the root is no longer watched"
                continue
            if not name:
                if rel == "" and mask & (IN_DELETE_SELF | IN_MOVE_SELF):
                    self._doubt = "the root was deleted or moved"
                continue  # the parent reports what happened to the directory
            path = f"{rel}/{name}" if rel else name
            if path in self._skip:
                continue
            if name in (".gitignore", ".git"):
                # What is ignored below (or a nested repository) changed:
                # the directory holding it is rescanned as a whole.
                self._mark(rel)
                continue
            self._mark(path)
            if mask & IN_ISDIR:
                if mask & (IN_MOVED_FROM | IN_DELETE):
                    self._unwatch_under(path)
                if mask & (IN_CREATE | IN_MOVED_TO | IN_ATTRIB):
                    self._pending.append(path)

    def _mark(self, path: str) -> None:
        self._dirty.add(path)
        if len(self._dirty) > self._max_dirty or len(self._pending) > self._max_dirty:
            self._doubt = f"more than {self._max_dirty} changed paths"
            self._dirty.clear()
            self._pending.clear()


async def open_watch(
    root: str,
    blocking: Blocking,
    *,
    skip: Iterable[str] = (),
    max_watches: int = MAX_WATCHES,
    max_dirty: int = MAX_DIRTY,
) -> TreeWatch | None:
    """A started watch over every directory of ``root``; None if it cannot be had.

    The caller owns it (closes it) and must run a full scan between
    :meth:`TreeWatch.begin_full` and :meth:`TreeWatch.end_full` before
    trusting :meth:`TreeWatch.changes`.
    """
    try:
        _lib()
    except (OSError, AttributeError) as exc:
        log.info("no inotify (%s): snapshots scan the whole tree", exc)
        return None
    try:
        fd = new_inotify()
    except OSError as exc:
        log.info("inotify_init1: %s: snapshots scan the whole tree", exc.strerror)
        return None
    watch = TreeWatch(root, fd, skip=skip, max_watches=max_watches, max_dirty=max_dirty)
    try:
        watch.start(asyncio.get_running_loop())
        await blocking(watch.watch_all)
    except BaseException:
        watch.close()
        raise
    if watch.broken is not None:
        log.info("cannot watch %s (%s): snapshots scan the whole tree", root, watch.broken)
        watch.close()
        return None
    return watch
