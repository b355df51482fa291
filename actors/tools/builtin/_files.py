"""The file tools: read, write, edit, list. Each is confined to the session's Location.

``read`` returns numbered lines (``cat -n`` style: the 1-based line number
right-aligned in 6 columns, a tab, the line), so a model can quote exact
lines to ``edit`` and page on with ``offset``. Images come back as a ``file``
content item (base64) next to a short text item.
"""

from __future__ import annotations

import base64
import mimetypes
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from actors.tools._types import ToolContext, ToolError, ToolResult, text_item
from actors.tools.builtin._paths import display, readable_path, writable_path

__all__ = ["EditTool", "ListTool", "ReadTool", "WriteTool"]

DEFAULT_READ_LIMIT: Final = 2_000
MAX_LINE_CHARS: Final = 2_000
MAX_IMAGE_BYTES: Final = 5 * 1024 * 1024
MAX_LIST_ENTRIES: Final = 1_000
_SNIFF_BYTES: Final = 8_192
_IMAGE_TYPES: Final = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})


def _is_binary(head: bytes) -> bool:
    return b"\x00" in head


def _clip(line: str, limit: int = MAX_LINE_CHARS) -> str:
    return line if len(line) <= limit else line[:limit] + " … (line truncated)"


class ReadTool:
    name = "read"
    description = (
        "Read a text file in the session's directory (or a managed tool-output file)."
        " Returns numbered lines: 'line-number<TAB>text'. Use offset (1-based line) and"
        " limit (default 2000) to page through large files. Images are returned as files."
    )
    input_schema: Mapping[str, Any] = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "minLength": 1, "description": "File to read."},
            "offset": {"type": "integer", "minimum": 1, "description": "First line (1-based)."},
            "limit": {"type": "integer", "minimum": 1, "description": "How many lines."},
        },
        "required": ["path"],
        "additionalProperties": False,
    }

    def run(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        target = readable_path(ctx, input["path"], managed=True)
        shown = display(ctx, target)
        if target.is_dir():
            raise ToolError(f"{shown} is a directory; use the list tool")
        if not target.is_file():
            raise ToolError(f"File not found: {shown}")
        mime, _ = mimetypes.guess_type(target.name)
        if mime in _IMAGE_TYPES:
            return _image(target, shown, mime)
        offset: int = input.get("offset", 1)
        limit: int = input.get("limit", DEFAULT_READ_LIMIT)
        with open(target, "rb") as raw:
            if _is_binary(raw.read(_SNIFF_BYTES)):
                raise ToolError(f"{shown} is a binary file")
        out: list[str] = []
        more = False
        last = 0
        with open(target, encoding="utf-8", errors="replace") as file:
            for number, line in enumerate(file, start=1):
                last = number
                if number < offset:
                    continue
                if len(out) == limit:
                    more = True
                    break
                text = _clip(line.rstrip("\n"))
                out.append(f"{number:>6}\t{text}")
        if not out:
            if last == 0:
                return ToolResult.text("(empty file)", path=shown, lines=0)
            return ToolResult.text(
                f"(no lines at offset {offset}; {shown} has {last} lines)", path=shown, lines=0
            )
        count = len(out)
        if more:
            out.append(f"\n(more lines follow; continue with offset={offset + count})")
        return ToolResult.text("\n".join(out), path=shown, lines=count)


def _image(target: Path, shown: str, mime: str) -> ToolResult:
    size = target.stat().st_size
    if size > MAX_IMAGE_BYTES:
        raise ToolError(f"{shown} is too large to read ({size} bytes)")
    data = base64.b64encode(target.read_bytes()).decode("ascii")
    return ToolResult(
        content=(
            text_item(f"Image {shown} ({mime}, {size} bytes)"),
            {"type": "file", "mime": mime, "data": data, "filename": shown},
        ),
        metadata={"path": shown},
    )


class WriteTool:
    name = "write"
    description = (
        "Write a file in the session's directory, replacing it if it exists."
        " Parent directories are created."
    )
    input_schema: Mapping[str, Any] = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "minLength": 1},
            "content": {"type": "string"},
        },
        "required": ["path", "content"],
        "additionalProperties": False,
    }

    def run(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        target = writable_path(ctx, input["path"])
        shown = display(ctx, target)
        if target.is_dir():
            raise ToolError(f"{shown} is a directory")
        created = not target.exists()
        data = input["content"].encode("utf-8", "surrogatepass")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        except OSError as exc:
            raise ToolError(f"Could not write {shown}: {exc.strerror or exc}") from exc
        verb = "Created" if created else "Wrote"
        return ToolResult.text(
            f"{verb} {shown} ({len(data)} bytes)", path=shown, bytes=len(data), created=created
        )


class EditTool:
    name = "edit"
    description = (
        "Replace text in a file in the session's directory. old_string must occur exactly"
        " once unless replace_all is true; include surrounding lines to make it unique."
    )
    input_schema: Mapping[str, Any] = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "minLength": 1},
            "old_string": {"type": "string", "minLength": 1},
            "new_string": {"type": "string"},
            "replace_all": {"type": "boolean", "default": False},
        },
        "required": ["path", "old_string", "new_string"],
        "additionalProperties": False,
    }

    def run(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        target = writable_path(ctx, input["path"])
        shown = display(ctx, target)
        old: str = input["old_string"]
        new: str = input["new_string"]
        if old == new:
            raise ToolError("old_string and new_string are identical", type="invalid-input")
        if not target.is_file():
            raise ToolError(f"File not found: {shown}")
        try:
            # newline="": keep the file's own line endings, byte for byte.
            with open(target, encoding="utf-8", newline="") as file:
                text = file.read()
        except UnicodeDecodeError as exc:
            raise ToolError(f"{shown} is not UTF-8 text") from exc
        count = text.count(old)
        if count == 0:
            raise ToolError(f"old_string was not found in {shown}")
        if count > 1 and not input.get("replace_all", False):
            raise ToolError(
                f"old_string occurs {count} times in {shown}; include more surrounding"
                " context to make it unique, or set replace_all"
            )
        try:
            with open(target, "w", encoding="utf-8", newline="") as file:
                file.write(text.replace(old, new))
        except OSError as exc:
            raise ToolError(f"Could not write {shown}: {exc.strerror or exc}") from exc
        noun = "occurrence" if count == 1 else "occurrences"
        return ToolResult.text(
            f"Replaced {count} {noun} in {shown}", path=shown, replacements=count
        )


class ListTool:
    name = "list"
    description = (
        "List a directory in the session's directory (default: its root)."
        " Entries are sorted by name; directories end with '/'."
    )
    input_schema: Mapping[str, Any] = {
        "type": "object",
        "properties": {"path": {"type": "string", "minLength": 1, "default": "."}},
        "additionalProperties": False,
    }

    def run(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        target = readable_path(ctx, input.get("path", "."))
        shown = display(ctx, target)
        if not target.is_dir():
            raise ToolError(f"Not a directory: {shown}")
        try:
            with os.scandir(target) as it:
                entries = sorted(entry.name + ("/" if entry.is_dir() else "") for entry in it)
        except OSError as exc:
            raise ToolError(f"Could not list {shown}: {exc.strerror or exc}") from exc
        if not entries:
            return ToolResult.text("(empty directory)", path=shown, count=0)
        lines = entries[:MAX_LIST_ENTRIES]
        if len(entries) > MAX_LIST_ENTRIES:
            lines.append(f"(… and {len(entries) - MAX_LIST_ENTRIES} more entries)")
        return ToolResult.text("\n".join(lines), path=shown, count=len(entries))
