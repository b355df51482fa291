"""Reading a snapshot store's blobs on a thread, streamed (``git cat-file --batch``).

A restore writes each file from its blob without holding it whole in memory:
one ``git cat-file --batch`` process answers every object id of the restore
in turn, and each answer is copied to its file in 1 MiB chunks. Blocking:
the restore runs on the runtime's BlockingExecutor.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from typing import IO, BinaryIO, Final

__all__ = ["BlobError", "BlobReader"]

_CHUNK: Final = 1024 * 1024


class BlobError(Exception):
    """git could not produce a blob (a missing object, a broken store)."""


class BlobReader:
    """One ``git cat-file --batch`` for a restore; closed with it."""

    def __init__(self, env: Mapping[str, str], cwd: str) -> None:
        self._proc = subprocess.Popen(
            ["git", "cat-file", "--batch"],
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )

    def __enter__(self) -> BlobReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        proc = self._proc
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def _ask(self, oid: str) -> tuple[IO[bytes], int]:
        stdin, stdout = self._proc.stdin, self._proc.stdout
        assert stdin is not None
        assert stdout is not None
        stdin.write(oid.encode() + b"\n")
        stdin.flush()
        header = stdout.readline().split()
        if len(header) != 3 or header[1] != b"blob":
            raise BlobError(f"git has no blob {oid}: {b' '.join(header).decode(errors='replace')}")
        return stdout, int(header[2])

    def copy(self, oid: str, out: BinaryIO) -> None:
        """Write blob ``oid`` into ``out``."""
        stdout, left = self._ask(oid)
        while left:
            chunk = stdout.read(min(left, _CHUNK))
            if not chunk:
                raise BlobError(f"git stopped in the middle of blob {oid}")
            out.write(chunk)
            left -= len(chunk)
        stdout.read(1)  # the newline after each object

    def read(self, oid: str) -> bytes:
        """Blob ``oid`` whole (a symlink's target: short)."""
        stdout, size = self._ask(oid)
        data = stdout.read(size)
        stdout.read(1)
        if len(data) != size:
            raise BlobError(f"git stopped in the middle of blob {oid}")
        return data
