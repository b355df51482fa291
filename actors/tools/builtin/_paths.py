"""Location confinement for the file tools, and a confined directory walk.

A session's file tools act inside its Location (``ctx.directory``) only, by
the rule of :mod:`actors.files.confine` (``..`` and symlinks are judged by where
they really lead), plus what the ``external_directory`` permission granted
this call (``ctx.external``, resolved paths judged before the call ran, see
:mod:`actors.permissions`). Exceptions:

- read-only: managed tool-output files (``<output_dir>/tool_…``) are readable
  by ``read`` and ``grep``, so a model can page through output that bounding
  moved aside. Nothing writes into the output directory.
- the server's own directories (``ctx.server_dirs``: the data dir, with the
  database and every session's log) are out of bounds even when they lie
  inside the Location: not readable, not listed by the walk, not writable.
- the project's configuration, ``<Location>/.sessionrt/``, is not writable
  unless the operator gave the agent the ``config`` permission
  (``ctx.config_writes``): an agent must not rewrite the ``agents.toml`` that
  decides its own permissions on the next prompt.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from actors.files.confine import PROJECT_CONFIG_DIR, PathRefused, inside, resolve
from actors.tools._types import ToolContext, ToolError

__all__ = [
    "Glob",
    "check_cancel",
    "display",
    "readable_path",
    "walk_files",
    "writable_path",
]

#: Directories the walking tools (glob, grep) never descend into.
SKIPPED_DIRS: Final = frozenset({".git"})
_CANCEL_EVERY: Final = 256


def check_cancel(ctx: ToolContext) -> None:
    """Raise ``ToolError(type="aborted")`` if the call was asked to stop."""
    if ctx.cancel.is_set():
        raise ToolError("Tool execution aborted", type="aborted")


def _resolve(ctx: ToolContext, raw: str) -> tuple[Path, Path]:
    location = ctx.directory.resolve()
    try:
        target = resolve(location, raw)
    except PathRefused as exc:
        raise ToolError(f"Invalid path {raw!r}: {exc.message}", type="invalid-input") from exc
    return location, target


def _granted(ctx: ToolContext, target: Path) -> bool:
    """Inside the Location, or inside a path ``external_directory`` granted this call."""
    return target.is_relative_to(ctx.directory.resolve()) or inside(target, ctx.external)


def _outside(raw: str, location: Path) -> ToolError:
    return ToolError(f"Path {raw!r} is outside the session's location ({location})", type="denied")


def _is_managed(ctx: ToolContext, target: Path) -> bool:
    return target.parent == ctx.output_dir.resolve() and target.name.startswith("tool_")


def _server_dirs(ctx: ToolContext) -> tuple[Path, ...]:
    # A Location inside a server directory exists only because the operator
    # allowed it (``allow_directories``): that opt-in covers its tools too.
    location = ctx.directory.resolve()
    resolved = (d.resolve() for d in ctx.server_dirs)
    return tuple(d for d in resolved if not location.is_relative_to(d))


def _withheld(raw: str) -> ToolError:
    return ToolError(f"Path {raw!r} belongs to the server", type="denied")


def readable_path(ctx: ToolContext, raw: str, *, managed: bool = False) -> Path:
    """Resolve ``raw`` for reading; with ``managed``, managed output files are allowed too.

    Raises:
        ToolError: ``denied`` outside the Location, ``invalid-input`` if unparsable.
    """
    location, target = _resolve(ctx, raw)
    if managed and _is_managed(ctx, target):
        return target
    if not _granted(ctx, target):
        raise _outside(raw, location)
    if inside(target, _server_dirs(ctx)):
        raise _withheld(raw)
    return target


def writable_path(ctx: ToolContext, raw: str) -> Path:
    """Resolve ``raw`` for writing: inside the Location and never in the output directory.

    Raises:
        ToolError: ``denied`` or ``invalid-input``.
    """
    location, target = _resolve(ctx, raw)
    if not _granted(ctx, target):
        raise _outside(raw, location)
    if target.is_relative_to(ctx.output_dir.resolve()):
        raise ToolError(f"Path {raw!r} is in the managed tool-output directory", type="denied")
    if inside(target, _server_dirs(ctx)):
        raise _withheld(raw)
    if not ctx.config_writes:
        config = location / PROJECT_CONFIG_DIR
        # Both spellings: ``.sessionrt`` may itself be a symlink to elsewhere in
        # the Location, and the catalog reads through it.
        if target.is_relative_to(config) or target.is_relative_to(config.resolve()):
            raise ToolError(
                f"Path {raw!r} is in the project's configuration ({PROJECT_CONFIG_DIR}/);"
                " writing it needs the operator's 'config' permission",
                type="denied",
            )
    return target


def display(ctx: ToolContext, path: Path) -> str:
    """``path`` as the model should see it: relative to the Location, else absolute."""
    location = ctx.directory.resolve()
    if path.is_relative_to(location):
        relative = path.relative_to(location).as_posix()
        return relative or "."
    return str(path)


def walk_files(ctx: ToolContext, root: Path, *, max_depth: int | None = None) -> Iterator[Path]:
    """Files under ``root`` (depth-first, names sorted), confined to the Location.

    Directory symlinks are not followed; a file symlink is yielded (as its
    link path) only if it resolves to a file inside the Location. ``.git`` is
    skipped. ``max_depth`` counts path components below ``root`` (1 = files
    directly in it). The server's directories are skipped. Polls ``ctx.cancel``.
    """
    location = ctx.directory.resolve()
    server = _server_dirs(ctx)
    stack: list[tuple[Path, int]] = [(root, 1)]
    seen = 0
    while stack:
        directory, depth = stack.pop()
        try:
            with os.scandir(directory) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        subdirs: list[Path] = []
        for entry in entries:
            seen += 1
            if seen % _CANCEL_EVERY == 0:
                check_cancel(ctx)
            try:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name in SKIPPED_DIRS or (max_depth is not None and depth >= max_depth):
                        continue
                    # Not followed through symlinks, so only the data dir itself can be met.
                    if server and Path(entry.path).resolve() in server:
                        continue
                    subdirs.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    yield Path(entry.path)
                elif entry.is_symlink():
                    real = Path(entry.path).resolve()
                    if (
                        (real.is_relative_to(location) or inside(real, ctx.external))
                        and real.is_file()
                        and not inside(real, server)
                    ):
                        yield Path(entry.path)
            except OSError:
                continue
        stack.extend((sub, depth + 1) for sub in reversed(subdirs))


class Glob:
    """A glob over ``/``-separated paths relative to some directory.

    Each component is an :mod:`fnmatch` pattern (``*``, ``?``, ``[...]``,
    ``[!...]``; ``*`` also matches a leading dot); a component that is exactly
    ``**`` matches any number of components, including none.
    """

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        parts = [part for part in pattern.split("/") if part not in ("", ".")]
        self._parts: tuple[re.Pattern[str] | None, ...] = tuple(
            None if part == "**" else re.compile(fnmatch.translate(part)) for part in parts
        )

    @property
    def depth(self) -> int | None:
        """How many components a match can have at most (``None`` with ``**``)."""
        return None if None in self._parts else len(self._parts)

    def matches(self, relative: str) -> bool:
        names = tuple(relative.split("/"))

        @functools.cache
        def match(p: int, n: int) -> bool:
            if p == len(self._parts):
                return n == len(names)
            part = self._parts[p]
            if part is None:
                return any(match(p + 1, k) for k in range(n, len(names) + 1))
            return n < len(names) and part.match(names[n]) is not None and match(p + 1, n + 1)

        return match(0, 0)
