"""Whether a spec's instruction files can have changed since they were observed (inotify).

Observing the file sources at every Safe Step Boundary is some twenty system
calls in an executor thread, each a GIL hand-off: with 100 sessions stepping
it was a seventh of the runtime's CPU. :class:`ObservationCache` keeps each
:class:`FileSpec`'s last observation and serves it again, without a thread
hop, while the kernel reports no change to anything it depended on; any doubt
makes it observe again, so what it serves is always what an observation now
would return.

What an observation depends on (:func:`dependencies`) is a set of names per
directory: the data dir's ``AGENTS.md`` and ``skills``; for each directory the
project walk visits, ``.git``, ``AGENTS.md``, ``CLAUDE.md`` and the name of the
next directory down the path (so a renamed or replaced component is seen);
``.sessionrt`` and ``skills`` on the way to the project's skills; every entry
of both skills directories; each skill's ``SKILL.md``. A spec is not cached at
all (observed every time) when it names references (their paths resolve
through symlinks anywhere in the Location), when any of those names or
directories is a symlink (the watch would see the link, not its target), when
a directory cannot be watched, or past :data:`MAX_WATCHES` directories.

An observation is trusted only when every dependency was registered (its
directory watched by the kernel) before the observation began: registering
takes a tick of a counter, beginning takes the next, so a change after
registration is either seen by the observation or queued as an event. The
events are read, without blocking, at every lookup (none is read by a loop
callback: a busy ``/tmp`` costs nothing between steps); any event on a
registered name, a watch the kernel dropped, or an overflowed event queue
moves the generation, and every entry observed before it is stale. A first
observation registers what it needs and is stored untrusted: the next one
(watches now in place) is trusted.

Not seen, as for :mod:`actors.files.watch`: writes through a shared ``mmap``, through
a hard link from outside the watched directories, and on a network file
system by another machine. Off Linux (or without inotify) nothing is cached.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from typing import Final

import attrs

from actors.files.confine import PROJECT_CONFIG_DIR
from actors.files.watch import (
    IN_DELETE_SELF,
    IN_IGNORED,
    IN_ISDIR,
    IN_MOVE_SELF,
    IN_Q_OVERFLOW,
    WATCH_MASK,
    inotify_lib,
    new_inotify,
    parse_events,
    read_queued,
)
from actors.instructions._sources import FileSpec, Observation, project_walk

__all__ = ["MAX_ENTRIES", "MAX_WATCHES", "ObservationCache", "dependencies"]

#: Directories watched at most; a spec needing more is observed every time.
MAX_WATCHES: Final = 4096
#: Specs whose last observation is kept, by count; over it, the cache starts again empty.
MAX_ENTRIES: Final = 1024
#: Any name in the directory matters (a skills directory's entries).
ANY: Final = "*"


def dependencies(spec: FileSpec) -> dict[str, set[str]] | None:
    """Blocking: the names per existing directory ``spec``'s observation depends
    on; None when it cannot be cached (see the module docstring).

    A directory that does not exist is covered by its parent's entry for its
    name (its appearing is an event there), so it is not listed.
    """
    if spec.references:
        return None
    deps: dict[str, set[str]] = {}
    linked = False

    def need(directory: str, *names: str) -> None:
        nonlocal linked
        try:
            mode = os.lstat(directory).st_mode
        except OSError:
            return
        if stat.S_ISLNK(mode):
            linked = True
        elif stat.S_ISDIR(mode):
            deps.setdefault(directory, set()).update(names)

    need(spec.data_dir, "AGENTS.md", "skills")
    if spec.discover_project:
        visited, used = project_walk(spec.directory)
        below = None
        for directory in visited:  # from the session's directory upward
            need(directory, ".git")
            if below is not None:
                need(directory, os.path.basename(below))
            below = directory
        for directory in used:
            need(directory, "AGENTS.md", "CLAUDE.md")
    config = os.path.join(spec.directory, PROJECT_CONFIG_DIR)
    need(spec.directory, PROJECT_CONFIG_DIR)
    need(config, "skills")
    for root in (os.path.join(spec.data_dir, "skills"), os.path.join(config, "skills")):
        need(root, ANY)
        if root in deps:
            try:
                entries = os.listdir(root)
            except OSError:
                return None
            for entry in entries:
                need(os.path.join(root, entry), "SKILL.md")
    if linked:
        return None
    for directory, names in deps.items():
        for name in names:
            if name != ANY and _is_link(os.path.join(directory, name)):
                return None
    return deps


def _is_link(path: str) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:
        return False


@attrs.frozen
class _Entry:
    generation: int
    trusted: bool
    observations: tuple[Observation, ...]


class ObservationCache:
    """Each spec's last observation, served while nothing it depends on changed."""

    def __init__(self, *, max_watches: int = MAX_WATCHES, max_entries: int = MAX_ENTRIES) -> None:
        self._max_watches = max_watches
        self._max_entries = max_entries
        self._lock = threading.Lock()
        #: The inotify descriptor from :meth:`open` to :meth:`close`; None: nothing is served.
        self._fd: int | None = None
        #: directory -> (its watch descriptor, {name: the tick it was registered at})
        self._dirs: dict[str, tuple[int, dict[str, int]]] = {}
        self._by_wd: dict[int, str] = {}
        self._ticks = 0
        self._generation = 0
        self._entries: dict[FileSpec, _Entry] = {}

    @property
    def enabled(self) -> bool:
        return self._fd is not None

    def open(self) -> None:
        """Start watching (inotify; without it, or before this, every lookup observes)."""
        with self._lock, contextlib.suppress(OSError, AttributeError):
            if self._fd is None:
                self._fd = new_inotify()

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, None
            self._dirs.clear()
            self._by_wd.clear()
            self._entries.clear()
        if fd is not None:
            os.close(fd)

    # -- on the loop ----------------------------------------------------------------------------

    def lookup(self, spec: FileSpec) -> list[Observation] | None:
        """The spec's observation if nothing it depends on changed since; None: observe.

        Reads the events queued so far first (a non-blocking read), so a change
        made before this call is never missed.
        """
        if self._fd is None:
            return None
        self._drain()
        entry = self._entries.get(spec)
        if entry is None or not entry.trusted or entry.generation != self._generation:
            return None
        return list(entry.observations)

    def begin(self) -> tuple[int, int]:
        """Before an observation starts: (tick, generation) to :meth:`store` it with."""
        with self._lock:
            self._ticks += 1
            return self._ticks, self._generation

    # -- in the observing thread ----------------------------------------------------------------

    def store(
        self, spec: FileSpec, begun: tuple[int, int], observations: list[Observation]
    ) -> None:
        """Keep ``observations`` (made after :meth:`begin` gave ``begun``) for ``spec``.

        Blocking (watches are added here). Trusted only when every dependency
        was registered before the observation began and no source was
        unreadable; otherwise stored untrusted (the next lookup observes).
        """
        if self._fd is None:
            return
        tick, generation = begun
        deps = None if any(o.unavailable for o in observations) else dependencies(spec)
        trusted = deps is not None and self._register(deps, tick)
        with self._lock:
            if len(self._entries) >= self._max_entries:
                self._entries.clear()
            if deps is None:
                self._entries.pop(spec, None)
            else:
                self._entries[spec] = _Entry(generation, trusted, tuple(observations))

    def _register(self, deps: dict[str, set[str]], tick: int) -> bool:
        """Watch every dependency; True when all were registered before ``tick``."""
        before = True
        for directory, names in deps.items():
            with self._lock:
                if self._fd is None:
                    return False
                known = self._dirs.get(directory)
                if known is None:
                    if len(self._dirs) >= self._max_watches:
                        return False
                    wd = inotify_lib().add_watch(self._fd, os.fsencode(directory), WATCH_MASK)
                    if wd < 0:
                        return False  # gone meanwhile, or the watch limit: not trusted
                    known = (wd, {})
                    self._dirs[directory] = known
                    self._by_wd[wd] = directory
                registered = known[1]
                for name in names:
                    at = registered.get(name)
                    if at is None:
                        self._ticks += 1
                        registered[name] = self._ticks
                        before = False
                    elif at >= tick:
                        before = False
        return before

    # -- events ---------------------------------------------------------------------------------

    def _drain(self) -> None:
        fd = self._fd
        if fd is None:
            return
        try:
            data = read_queued(fd)
        except OSError:
            self.close()  # cannot vouch for anything any more
            return
        if data:
            with self._lock:
                self._fold(data)

    def _fold(self, data: bytes) -> None:
        for wd, mask, name in parse_events(data):
            if mask & IN_Q_OVERFLOW:
                self._generation += 1
                continue
            directory = self._by_wd.get(wd)
            if directory is None:
                continue
            if mask & (IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF):
                # The directory went (or moved): what depended on it is observed
                # again, and registers anew at that path.
                self._generation += 1
                self._forget(directory)
                continue
            names = self._dirs[directory][1]
            if ANY in names or name in names:
                self._generation += 1
                if mask & IN_ISDIR:
                    # A directory on a watched path was renamed, replaced or
                    # removed: the watches below it name another inode now.
                    self._forget(os.path.join(directory, name))

    def _forget(self, top: str) -> None:
        """Drop the registrations of ``top`` and every directory below it (lock held)."""
        below = top.rstrip("/") + "/"
        for directory in [d for d in self._dirs if d == top or d.startswith(below)]:
            wd, _ = self._dirs.pop(directory)
            self._by_wd.pop(wd, None)
            if self._fd is not None:
                inotify_lib().rm_watch(self._fd, wd)
