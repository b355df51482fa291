"""The search tools: glob (find files by name) and grep (find lines by regex).

Both walk the Location with :func:`~actors.tools.builtin._paths.walk_files`
(no directory symlinks followed, ``.git`` skipped), poll ``ctx.cancel``, and
cap what they return. ``grep`` is pure Python (:mod:`re`), so there is no
dependency on an external ``rg``; it can also search one managed tool-output
file by its absolute path.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any, Final

from actors.tools._types import ToolContext, ToolError, ToolResult
from actors.tools.builtin._paths import Glob, check_cancel, display, readable_path, walk_files

__all__ = ["GlobTool", "GrepTool"]

MAX_GLOB_MATCHES: Final = 1_000
MAX_GREP_MATCHES: Final = 500
MAX_MATCH_CHARS: Final = 500
_SNIFF_BYTES: Final = 8_192
_CANCEL_EVERY_LINES: Final = 10_000


class GlobTool:
    name = "glob"
    description = (
        "Find files in the session's directory by glob pattern, relative to it:"
        " '*' and '?' stay within one path component, '**' spans directories"
        " (e.g. '**/*.py'). Returns sorted relative paths."
    )
    input_schema: Mapping[str, Any] = {
        "type": "object",
        "properties": {"pattern": {"type": "string", "minLength": 1}},
        "required": ["pattern"],
        "additionalProperties": False,
    }

    def run(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        pattern: str = input["pattern"]
        parts = PurePosixPath(pattern).parts
        if pattern.startswith("/") or ".." in parts:
            raise ToolError(
                f"Pattern {pattern!r} must stay inside the session's location", type="denied"
            )
        glob = Glob(pattern)
        root = ctx.directory.resolve()
        matches = sorted(
            relative
            for relative in (
                path.relative_to(root).as_posix()
                for path in walk_files(ctx, root, max_depth=glob.depth)
            )
            if glob.matches(relative)
        )
        if not matches:
            return ToolResult.text("No files found", count=0)
        lines = matches[:MAX_GLOB_MATCHES]
        if len(matches) > MAX_GLOB_MATCHES:
            lines.append(f"(… and {len(matches) - MAX_GLOB_MATCHES} more files)")
        return ToolResult.text("\n".join(lines), count=len(matches))


class GrepTool:
    name = "grep"
    description = (
        "Search file contents with a Python regular expression. Optional path (a"
        " directory or file; default the session's directory) and include (a glob on"
        " file names, e.g. '*.py', or on relative paths if it contains '/')."
        " Returns 'file:line:text' lines."
    )
    input_schema: Mapping[str, Any] = {
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "minLength": 1},
            "path": {"type": "string", "minLength": 1},
            "include": {"type": "string", "minLength": 1},
        },
        "required": ["pattern"],
        "additionalProperties": False,
    }

    def run(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            regex = re.compile(input["pattern"])
        except re.error as exc:
            raise ToolError(f"Invalid regular expression: {exc}", type="invalid-input") from exc
        target = readable_path(ctx, input.get("path", "."), managed=True)
        include = input.get("include")
        if target.is_dir():
            files: Iterable[Path] = _included(ctx, target, include)
        elif target.is_file():
            files = (target,)
        else:
            raise ToolError(f"Path not found: {display(ctx, target)}")

        out: list[str] = []
        capped = False
        for path in files:
            check_cancel(ctx)
            capped = _search(ctx, path, regex, out)
            if capped:
                break
        if not out:
            return ToolResult.text("No matches found", matches=0)
        count = len(out)
        if capped:
            out.append(f"(results capped at {MAX_GREP_MATCHES} matches)")
        return ToolResult.text("\n".join(out), matches=count, capped=capped)


def _included(ctx: ToolContext, root: Path, include: str | None) -> Iterable[Path]:
    if include is None:
        yield from walk_files(ctx, root)
        return
    glob = Glob(include)
    on_path = "/" in include
    for path in walk_files(ctx, root):
        subject = path.relative_to(root).as_posix() if on_path else path.name
        if glob.matches(subject):
            yield path


def _search(ctx: ToolContext, path: Path, regex: re.Pattern[str], out: list[str]) -> bool:
    """Append matches in ``path`` to ``out``; True once the cap is reached."""
    shown = display(ctx, path)
    try:
        with open(path, "rb") as raw:
            if b"\x00" in raw.read(_SNIFF_BYTES):
                return False
        with open(path, encoding="utf-8", errors="replace") as file:
            for number, line in enumerate(file, start=1):
                if number % _CANCEL_EVERY_LINES == 0:
                    check_cancel(ctx)
                text = line.rstrip("\n")
                if regex.search(text) is None:
                    continue
                if len(text) > MAX_MATCH_CHARS:
                    text = text[:MAX_MATCH_CHARS] + " …"
                out.append(f"{shown}:{number}:{text}")
                if len(out) >= MAX_GREP_MATCHES:
                    return True
    except OSError:
        return False  # unreadable or vanished mid-walk: not a match, not a failure
    return False
