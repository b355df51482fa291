"""Streamed command output bounded as it arrives, spilled whole to a managed file.

Used by the bash tool and by user shell commands (:mod:`actors.session.shells`), so
a chatty command costs a file, never unbounded memory and never lost output.
Everything here that touches the file system blocks: call it on a worker thread.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import BinaryIO

from protocol import ids

__all__ = ["SpillingOutput"]


class SpillingOutput:
    """The command's output, bounded while it streams.

    Up to ``memory`` bytes are kept whole. Past that, the complete output goes
    to a managed file (``output_dir/tool_<id>``, as bounding names its files)
    and memory keeps only the first and the last ``memory / 2`` bytes: a
    chatty command costs a file, never unbounded memory. If the file cannot
    be written, the middle is lost and the text says so.
    """

    def __init__(self, memory: int, spill_dir: Path) -> None:
        self._memory = memory
        self._half = max(1, memory // 2)
        self._spill_dir = spill_dir
        self._all = bytearray()  # everything, until it passes `memory`
        self._head = bytearray()
        self._tail = bytearray()
        self._file: BinaryIO | None = None
        self.total = 0
        self.path: Path | None = None
        self.spill_error: str | None = None

    @property
    def spilled(self) -> bool:
        return self.path is not None or self.spill_error is not None

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        if not self.spilled:
            self._all += chunk
            if len(self._all) > self._memory:
                self._spill()
            return
        self._write(chunk)
        self._tail += chunk
        if len(self._tail) > 2 * self._half:
            del self._tail[: -self._half]

    def _spill(self) -> None:
        data, self._all = self._all, bytearray()
        self._head = data[: self._half]
        self._tail = data[-self._half :]
        try:
            self._spill_dir.mkdir(parents=True, exist_ok=True)
            path = self._spill_dir / ids.tool_output_id()
            self._file = open(path, "xb")  # noqa: SIM115 - closed by close()
        except OSError as exc:
            self.spill_error = f"{type(exc).__name__}: {exc}"
            return
        self.path = path
        self._write(data)

    def _write(self, chunk: bytes | bytearray) -> None:
        if self._file is None:
            return
        try:
            self._file.write(chunk)
        except OSError as exc:
            self.spill_error = f"{type(exc).__name__}: {exc}"
            self._close_file()

    def _close_file(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            with contextlib.suppress(OSError):
                file.close()

    def close(self) -> None:
        """Flush and close the spill file (it stays: it is the call's managed output)."""
        self._close_file()

    def tail(self, size: int) -> str:
        data = self._tail if self.spilled else self._all
        return data[-size:].decode("utf-8", "replace")

    def text(self) -> str:
        if not self.spilled:
            return self._all.decode("utf-8", "replace")
        # Whole lines on both sides of the gap, when there are any.
        head, tail = bytes(self._head), bytes(self._tail[-self._half :])
        cut = head.rfind(b"\n")
        head = head[: cut + 1] if cut >= 0 else head
        cut = tail.find(b"\n")
        tail = tail[cut + 1 :] if 0 <= cut < len(tail) - 1 else tail
        omitted = self.total - len(head) - len(tail)
        if self.path is not None and self.spill_error is None:
            where = f"full output saved to {self.path}"
        else:
            where = f"the full output could not be saved: {self.spill_error}"
        marker = f"(… {omitted} bytes of output omitted here; {where} …)"
        return (
            head.decode("utf-8", "replace")
            + ("" if head.endswith(b"\n") or not head else "\n")
            + marker
            + "\n"
            + tail.decode("utf-8", "replace")
        )

    def saved(self) -> Path | None:
        """The managed file holding the complete output, if it was spilled whole."""
        return self.path if self.spill_error is None else None
