"""OutputBounding: the final size limit on a tool's model-visible output.

The algorithm follows OpenCode's ``tool-output.ts`` (reference §4.7):

- A result whose metadata already has ``truncated`` (true *or* false) has been
  bounded, by the tool itself or earlier, and passes through untouched.
- All text items are joined with ``"\\n"``; a trailing newline is not another
  line. If the lines fit ``max_lines`` and the UTF-8 bytes fit ``max_bytes``,
  the content is unchanged and ``metadata.truncated`` is ``False``.
- Otherwise the preview keeps the **beginning and the end** (the glossary:
  "Generic truncation preserves the beginning and end of textual output";
  OpenCode's version read keeps the head only). Whole lines only: the
  beginning takes up to half of ``max_lines`` and of ``max_bytes``, the end
  what is left of both, then the beginning any remainder; newlines inside each
  part count. The omitted amount is counted in lines when the line budget is
  spent, else in bytes. Text items are cut in order; non-text items keep their
  place; the marker ``... <N> <unit> truncated; full content saved to <path> ...``
  stands where text was left out (after the beginning, before the end).
- A structured-only result (``structured`` set, no text item) is first given
  a text item: its value as indented JSON. That preview is bounded like any
  text (the managed file holds the whole JSON); ``structured`` is untouched.
- The complete joined text is written to ``output_dir/tool_<id>`` *before* the
  preview is returned, and ``metadata`` gets ``truncated: True`` and
  ``outputPath``.

If that file cannot be written, the call still succeeds (a storage failure
must not turn a successful operation into a failed one) with an explicitly
lossy preview: the marker says the content could not be saved, ``metadata``
has ``truncated: True`` and ``outputError`` but no ``outputPath``, and the
failure is logged for operators. (OpenCode's ``specs/v2/tools.md`` fails the
settlement instead; the seed rules in CONTEXT.md and this project choose the
lossy success.)

Managed files expire: :meth:`OutputBounding.sweep` deletes ``tool_…`` files
whose *modification time* is older than the retention period; ids are not
trusted as clocks. :func:`run_sweeper` runs it at start and then hourly.

Everything here that touches the filesystem blocks: call it on a worker thread
(the executor bounds inside the tool's own job; :func:`run_sweeper` goes
through the :class:`~actors.BlockingExecutor`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import attrs

from actors.kit import ActorDeadError, BlockingExecutor
from actors.tools._types import Content, ToolResult, text_item
from protocol import ids
from storage.clock import SYSTEM, Clock

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_LINES",
    "DEFAULT_RETENTION_DAYS",
    "SWEEP_INTERVAL_S",
    "OutputBounding",
    "run_sweeper",
]

logger = logging.getLogger(__name__)

DEFAULT_MAX_LINES: Final = 2_000
DEFAULT_MAX_BYTES: Final = 50 * 1024
DEFAULT_RETENTION_DAYS: Final = 7
SWEEP_INTERVAL_S: Final = 3600.0

# Only names we mint are ever deleted (``tool_`` + at least 12 hex digits of
# the time-ascending id), so a stray file an operator put there survives.
_MANAGED_NAME: Final = re.compile(r"tool_[0-9a-f]{12}")
# Lone surrogates (from surrogateescape-decoded output) still count and are
# still saved, byte for byte, instead of failing the settlement.
_ERRORS: Final = "surrogatepass"


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", _ERRORS))


def _is_text(item: Content) -> bool:
    return item.get("type") == "text" and isinstance(item.get("text"), str)


def _amount(count: int, unit: str) -> str:
    return f"{count} {unit}" if count == 1 else f"{count} {unit}s"


class OutputBounding:
    """Bounds tool results and owns the managed tool-output directory.

    ``clock`` (:mod:`storage.clock`) says what "now" is to :meth:`sweep`;
    tests inject one they set (or pass ``now``) instead of ageing files in real time.
    """

    def __init__(
        self,
        *,
        output_dir: Path,
        max_lines: int = DEFAULT_MAX_LINES,
        max_bytes: int = DEFAULT_MAX_BYTES,
        retention_days: float = DEFAULT_RETENTION_DAYS,
        clock: Clock = SYSTEM,
    ) -> None:
        if max_lines < 1 or max_bytes < 1:
            raise ValueError("max_lines and max_bytes must be positive")
        if retention_days <= 0:
            raise ValueError("retention_days must be positive")
        # absolute(), not resolve(): no filesystem access on whatever thread builds us.
        self._output_dir = Path(output_dir).absolute()
        self._max_lines = max_lines
        self._max_bytes = max_bytes
        self._retention_s = retention_days * 86_400.0
        self._clock = clock

    def __repr__(self) -> str:
        return (
            f"<OutputBounding {self._max_lines} lines / {self._max_bytes} bytes"
            f" -> {self._output_dir}>"
        )

    @property
    def output_dir(self) -> Path:
        return self._output_dir

    @property
    def max_lines(self) -> int:
        return self._max_lines

    @property
    def max_bytes(self) -> int:
        return self._max_bytes

    @property
    def retention_s(self) -> float:
        return self._retention_s

    def bound(self, result: ToolResult) -> ToolResult:
        """Return ``result`` bounded to the limits (blocking: may write a file)."""
        if result.structured is not None and not any(_is_text(i) for i in result.content):
            # Structured-only: the model reads a JSON preview, bounded like any text;
            # the value itself stays untouched in ``result.structured``.
            preview = json.dumps(result.structured, indent=2, ensure_ascii=False, default=str)
            result = attrs.evolve(result, content=(*result.content, text_item(preview)))
        if "truncated" in result.metadata:
            return result
        if result.saved is not None:
            return self._bound_saved(result, result.saved)
        text = "\n".join(item["text"] for item in result.content if _is_text(item))
        lines = text.split("\n")
        if text.endswith("\n"):
            lines.pop()
        total_bytes = _utf8_len(text)
        if len(lines) <= self._max_lines and total_bytes <= self._max_bytes:
            return attrs.evolve(result, metadata={**result.metadata, "truncated": False})

        head, tail, kept_bytes = self._keep(lines, total_bytes)
        omitted_lines = len(lines) - head - tail
        omitted = (
            _amount(omitted_lines, "line")
            if omitted_lines and head + tail == self._max_lines
            else _amount(total_bytes - kept_bytes, "byte")
        )
        # Where the kept text sits in the joined text: [0, head_end) and [tail_start, stop).
        head_end = sum(len(line) for line in lines[:head]) + max(0, head - 1)
        tail_start = len(text) if not tail else len(text) - len("\n".join(lines[-tail:]))
        stop = len(text)
        if text.endswith("\n"):
            tail_start -= 1  # lines[-tail:] was measured without the trailing newline
            if tail and kept_bytes < total_bytes and kept_bytes + 1 > self._max_bytes:
                stop -= 1  # the trailing newline did not fit
            elif tail:
                kept_bytes += 1
            else:
                stop = tail_start = len(text)

        metadata: dict[str, Any] = {**result.metadata, "truncated": True}
        try:
            path = self._save(text)
        except (OSError, ValueError) as exc:
            logger.warning("could not save full tool output to %s: %s", self._output_dir, exc)
            marker = f"... {omitted} truncated; full content could not be saved ..."
            metadata["outputError"] = f"{type(exc).__name__}: {exc}"
        else:
            marker = f"... {omitted} truncated; full content saved to {path} ..."
            metadata["outputPath"] = str(path)
        return ToolResult(
            content=_cut(result.content, head_end, tail_start, stop, text_item(marker)),
            metadata=metadata,
            structured=result.structured,
        )

    def _bound_saved(self, result: ToolResult, saved: Path) -> ToolResult:
        """A result whose complete output a tool already spilled to ``saved``.

        Its text is a head and a tail of that output (the tool's own marker
        between them); the preview keeps the beginning and end of that text
        and refers to ``saved``, counting what it leaves out of the whole.
        """
        metadata: dict[str, Any] = {**result.metadata, "truncated": True, "outputPath": str(saved)}
        text = "\n".join(item["text"] for item in result.content if _is_text(item))
        lines = text.split("\n")
        if text.endswith("\n"):
            lines.pop()
        total_bytes = _utf8_len(text)
        if len(lines) <= self._max_lines and total_bytes <= self._max_bytes:
            return attrs.evolve(result, metadata=metadata, saved=None)
        head, tail, kept_bytes = self._keep(lines, total_bytes)
        head_end = sum(len(line) for line in lines[:head]) + max(0, head - 1)
        tail_start = len(text) if not tail else len(text) - len("\n".join(lines[-tail:]))
        stop = len(text)
        if text.endswith("\n"):
            tail_start -= 1
            if not tail:
                stop = tail_start = len(text)
        omitted = _amount(max(0, result.saved_bytes - kept_bytes), "byte")
        marker = f"... {omitted} truncated; full content saved to {saved} ..."
        return ToolResult(
            content=_cut(result.content, head_end, tail_start, stop, text_item(marker)),
            metadata=metadata,
            structured=result.structured,
        )

    def _keep(self, lines: list[str], total_bytes: int) -> tuple[int, int, int]:
        """How many whole lines to keep at the start and at the end, and their bytes.

        The beginning gets the first half of both budgets, the end what is left,
        then the beginning any remainder; kept bytes include the newlines inside
        each part, not the omitted span between them.
        """
        sizes = [_utf8_len(line) for line in lines]
        count = len(lines)
        head = tail = head_bytes = tail_bytes = 0

        def extend(from_end: bool, max_lines: int, max_bytes: int) -> None:
            nonlocal head, tail, head_bytes, tail_bytes
            while head + tail < count and head + tail < max_lines:
                if from_end:
                    size = sizes[count - 1 - tail] + (1 if tail else 0)
                else:
                    size = sizes[head] + (1 if head else 0)
                if head_bytes + tail_bytes + size > max_bytes:
                    return
                if from_end:
                    tail, tail_bytes = tail + 1, tail_bytes + size
                else:
                    head, head_bytes = head + 1, head_bytes + size

        extend(False, (self._max_lines + 1) // 2, self._max_bytes // 2)
        extend(True, self._max_lines, self._max_bytes)
        extend(False, self._max_lines, self._max_bytes)
        joined = head_bytes + tail_bytes + (1 if head and tail else 0)
        if head + tail == count and joined <= self._max_bytes:
            # Every line fits: only the trailing newline is left out, at the end.
            return count, 0, joined
        return head, tail, head_bytes + tail_bytes

    def _save(self, text: str) -> Path:
        self._output_dir.mkdir(parents=True, exist_ok=True)
        path = self._output_dir / ids.tool_output_id()
        try:
            # "x": ids are unique, so an existing file means something is badly wrong.
            with open(path, "x", encoding="utf-8", errors=_ERRORS, newline="") as file:
                file.write(text)
        except BaseException:
            with contextlib.suppress(OSError):
                path.unlink()
            raise
        return path

    def is_managed(self, path: Path) -> bool:
        """Whether ``path`` (already resolved) names a file in the managed directory."""
        return path.parent == self._output_dir.resolve() and path.name.startswith("tool_")

    def sweep(self, now: float | None = None) -> int:
        """Delete managed files last modified before ``now - retention``; return how many.

        Blocking. Errors on individual files are skipped (another sweeper, or
        the file vanished); a missing directory is an empty one.
        """
        cutoff = (self._clock.now_ms() / 1000 if now is None else now) - self._retention_s
        removed = 0
        try:
            entries = os.scandir(self._output_dir)
        except OSError:
            return 0
        with entries:
            for entry in entries:
                if not _MANAGED_NAME.match(entry.name):
                    continue
                try:
                    info = entry.stat(follow_symlinks=False)
                    if not stat.S_ISREG(info.st_mode) or info.st_mtime >= cutoff:
                        continue
                    os.unlink(entry.path)
                except OSError:
                    continue
                removed += 1
        return removed


def _cut(
    content: tuple[Content, ...], head_end: int, tail_start: int, stop: int, marker: Content
) -> list[Content]:
    """Keep joined-text characters ``[0, head_end)`` and ``[tail_start, stop)``.

    ``marker`` takes the place of what is left out; non-text items keep theirs.
    """
    bounded: list[Content] = []
    position = 0
    seen_text = marked = False
    for item in content:
        if not _is_text(item):
            bounded.append(item)
            continue
        text: str = item["text"]
        if seen_text:
            position += 1  # the "\n" that joined this item to the previous one
        seen_text = True
        start, end = position, position + len(text)
        position = end
        if end <= head_end:
            bounded.append(item)
            continue
        head = text[: max(0, head_end - start)]
        tail = text[max(0, tail_start - start) : max(0, stop - start)] if end > tail_start else ""
        if head:
            bounded.append({**item, "text": head})
        if not marked:
            bounded.append(marker)
            marked = True
        if tail:
            bounded.append(item if tail == text else {**item, "text": tail})
    if not marked:
        bounded.append(marker)
    return bounded


async def run_sweeper(
    bounding: OutputBounding,
    runner: BlockingExecutor,
    clock: Clock = SYSTEM,
    interval_s: float = SWEEP_INTERVAL_S,
    *,
    on_sweep: Callable[[int], None] | None = None,
) -> None:
    """Sweep now and then every ``interval_s``, until cancelled or the runner closes.

    Meant to be owned by the runtime as a task in its task group; cancelling
    it is the way to stop it. The file work runs on ``runner``'s threads; the
    interval is waited on ``clock``.
    ``on_sweep`` receives each sweep's count (for diagnostics and tests).
    """
    while True:
        try:
            removed = await runner.run(bounding.sweep)
        except ActorDeadError:
            return  # the runner closed under us: the runtime is shutting down
        if on_sweep is not None:
            on_sweep(removed)
        await clock.sleep(interval_s)
