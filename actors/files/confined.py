"""File operations confined to one directory at the moment each is made.

A revert restores files a model's bash may have rearranged at will: a
tracked symlink turned into a real directory, a directory turned into a
symlink to the data dir. Checking the paths once and then working on them
by name is not enough (a restore that recreates a symlink can make a later
path lead through it), so every operation here goes through directory file
descriptors: :class:`ConfinedDir` opens the base once and reaches each
parent one component at a time with ``O_NOFOLLOW | O_DIRECTORY``, and
unlinks, renames, makes directories and symlinks relative to that
descriptor. A symlink met on the way is never followed: the path is outside
(for a removal: there is nothing inside to remove; for a write: refused).
Each directory opened is compared (device, inode) with the forbidden ones
(the data dir), so a bind mount or a symlink swapped in between cannot lead
there either.

:func:`apply_entries` makes a set of paths what a snapshot says, in three
phases: removals deepest first (a directory only if it is then empty),
regular files (written to a temporary name, then renamed over: a hard link
to a file outside is replaced, never written through), and symlinks last,
so no path of the plan can lead through a symlink the plan itself made.
:func:`check_entries` runs the same walk read-only first, so a plan that
cannot be applied is refused before anything changes.

All of this is blocking: call it on a thread (the runtime's BlockingExecutor).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import BinaryIO, Final, Literal

import attrs

__all__ = ["ConfinedDir", "Entry", "Refused", "apply_entries", "check_entries"]

_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_TMP_PREFIX: Final = ".sessionrt-restore-"

Kind = Literal["file", "exec", "link"]
#: Copies a blob (by object id) into an open file.
WriteBlob = Callable[[str, BinaryIO], None]
#: Reads a blob (a symlink's target) whole.
ReadBlob = Callable[[str], bytes]


class Refused(Exception):
    """The operation would leave the directory, touch a forbidden one, or lose a file.

    ``changed``: the files may no longer be as they were (a restore refused
    half way whose putting back failed too).
    """

    def __init__(self, message: str, *, changed: bool = False) -> None:
        super().__init__(message)
        self.changed = changed


@attrs.frozen(kw_only=True)
class Entry:
    """What one path is in a snapshot: a file, an executable, a symlink, or absent (None)."""

    kind: Kind | None
    oid: str = ""


def _components(rel: str) -> list[str]:
    parts = rel.split("/")
    if not rel or rel.startswith("/") or "\0" in rel or any(p in ("", ".", "..") for p in parts):
        raise Refused(f"refusing path {rel!r}")
    return parts


class ConfinedDir:
    """A directory and the operations below it, every one made through descriptors."""

    def __init__(self, base: str, forbidden: Iterable[str] = ()) -> None:
        self._forbidden: set[tuple[int, int]] = set()
        for path in forbidden:
            with contextlib.suppress(OSError):
                st = os.stat(path)
                self._forbidden.add((st.st_dev, st.st_ino))
        self._root = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            self._check_fd(self._root, base)
        except BaseException:
            os.close(self._root)
            raise

    def close(self) -> None:
        os.close(self._root)

    def __enter__(self) -> ConfinedDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_fd(self, fd: int, rel: str) -> None:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) in self._forbidden:
            raise Refused(f"refusing {rel!r}: it is the server's data directory")

    @contextlib.contextmanager
    def parent(self, rel: str, *, create: bool = False) -> Iterator[tuple[int, str] | None]:
        """The open parent directory of ``rel`` and its last name; None if a parent is
        missing (``create`` makes it) or is not a real directory (a symlink: outside)."""
        parts = _components(rel)
        fd = os.dup(self._root)
        try:
            for i, name in enumerate(parts[:-1]):
                try:
                    child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        yield None
                        return
                    os.mkdir(name, 0o777, dir_fd=fd)
                    child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    if create:
                        where = "/".join(parts[: i + 1])
                        raise Refused(f"refusing {rel!r}: {where!r} is not a directory") from None
                    yield None
                    return
                os.close(fd)
                fd = child
                self._check_fd(fd, "/".join(parts[: i + 1]))
            yield fd, parts[-1]
        finally:
            os.close(fd)

    def lstat(self, rel: str) -> os.stat_result | None:
        """``rel``'s own status (a symlink not followed); None if it is not inside."""
        with self.parent(rel) as found:
            if found is None:
                return None
            fd, name = found
            try:
                return os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                return None

    def children(self, rel: str) -> list[str]:
        """The names in directory ``rel`` (opened without following a symlink)."""
        with self.parent(rel) as found:
            if found is None:
                return []
            fd, name = found
            try:
                sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError:
                return []
            try:
                self._check_fd(sub, rel)
                return os.listdir(sub)
            finally:
                os.close(sub)

    def remove(self, rel: str) -> bool:
        """Unlink ``rel`` (a directory: only if empty); whether something went."""
        with self.parent(rel) as found:
            if found is None:
                return False
            fd, name = found
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                return False
            if stat.S_ISDIR(st.st_mode):
                sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
                try:
                    self._check_fd(sub, rel)
                finally:
                    os.close(sub)
                try:
                    os.rmdir(name, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                        why = "the directory holds other files"
                        raise Refused(f"refusing {rel!r}: {why}") from None
                    raise
            else:
                os.unlink(name, dir_fd=fd)
            return True

    def prune(self, rel: str) -> None:
        """Remove the directories above ``rel`` left empty, up to the base."""
        parts = _components(rel)
        for cut in range(len(parts) - 1, 0, -1):
            try:
                self.remove("/".join(parts[:cut]))
            except (Refused, OSError):
                return

    def write(self, rel: str, kind: Kind, fill: Callable[[BinaryIO], None]) -> None:
        """Make ``rel`` a file (``exec``: executable) with what ``fill`` writes."""
        with self.parent(rel, create=True) as found:
            assert found is not None
            fd, name = found
            mode = 0o777 if kind == "exec" else 0o666  # the umask applies, as for git
            tmp = _TMP_PREFIX + os.urandom(6).hex()
            out = os.open(
                tmp,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                mode,
                dir_fd=fd,
            )
            try:
                with os.fdopen(out, "wb") as f:
                    fill(f)
                os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=fd)
                raise

    def symlink(self, rel: str, target: bytes) -> None:
        """Make ``rel`` a symlink to ``target`` (never followed here)."""
        with self.parent(rel, create=True) as found:
            assert found is not None
            fd, name = found
            tmp = _TMP_PREFIX + os.urandom(6).hex()
            os.symlink(target, tmp, dir_fd=fd)
            try:
                os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=fd)
                raise


def _depth(rel: str) -> tuple[int, str]:
    return (-rel.count("/"), rel)


def check_entries(tree: ConfinedDir, entries: Mapping[str, Entry]) -> None:
    """Refuse (:class:`Refused`) a plan :func:`apply_entries` could not carry out whole.

    Read-only. A path that must exist needs each existing parent to be a real
    directory unless the plan removes that parent; a directory that must
    become a file or symlink must hold nothing but what the plan removes.
    """
    for rel, entry in sorted(entries.items()):
        parts = _components(rel)
        st = tree.lstat(rel)  # walks to it: a forbidden directory on the way refuses
        if entry.kind is None:
            continue
        for cut in range(1, len(parts)):
            above = "/".join(parts[:cut])
            found = tree.lstat(above)
            if found is None:
                break  # missing from here down: made as directories
            if stat.S_ISDIR(found.st_mode):
                continue
            gone = entries.get(above)
            if gone is None or gone.kind is not None:
                raise Refused(f"refusing {rel!r}: {above!r} is not a directory")
            break  # a file or symlink the plan removes first
        if st is not None and stat.S_ISDIR(st.st_mode):
            _check_clears(tree, rel, entries)


def _check_clears(tree: ConfinedDir, rel: str, entries: Mapping[str, Entry]) -> None:
    """Refuse unless the removals of the plan leave directory ``rel`` empty."""
    names = tree.children(rel)
    if not names and rel not in entries:
        raise Refused(f"refusing {rel!r}: an empty directory no file of the plan removes")
    for name in names:
        child = f"{rel}/{name}"
        st = tree.lstat(child)
        if st is not None and stat.S_ISDIR(st.st_mode):
            _check_clears(tree, child, entries)
            continue
        planned = entries.get(child)
        if planned is None or planned.kind is not None:
            raise Refused(f"refusing {rel!r}: the directory holds {child!r}, which is not restored")


def apply_entries(
    tree: ConfinedDir,
    entries: Mapping[str, Entry],
    write_blob: WriteBlob,
    read_blob: ReadBlob,
    touched: list[str] | None = None,
) -> None:
    """Make each path what its entry says: removals, files, then symlinks.

    ``touched`` (if given) collects each path as it is about to change, so a
    caller can put them back if a later one is refused.
    """
    note = touched.append if touched is not None else (lambda _: None)
    for rel in sorted(entries, key=_depth):
        entry = entries[rel]
        st = tree.lstat(rel)
        if st is None:
            continue
        is_dir = stat.S_ISDIR(st.st_mode)
        if entry.kind is None and is_dir:
            continue  # a directory with entries of its own below it: those say
        if entry.kind is None or is_dir:
            note(rel)
            tree.remove(rel)
            if entry.kind is None:
                tree.prune(rel)
    files = sorted(r for r, e in entries.items() if e.kind in ("file", "exec"))
    links = sorted(r for r, e in entries.items() if e.kind == "link")
    for rel in files:
        entry = entries[rel]
        assert entry.kind is not None
        note(rel)
        tree.write(rel, entry.kind, functools.partial(write_blob, entry.oid))
    for rel in links:
        note(rel)
        tree.symlink(rel, read_blob(entries[rel].oid))
