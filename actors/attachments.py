"""Prompt attachments: what a client attaches, turned into inline data at admission.

An attachment is inline base64 (``data`` or a ``data:…;base64,`` URL) or a
``file:`` URL read once, at admission, so the log holds what the model will
see even if the file changes later.

A ``file:`` URL may only name a regular file inside the session's directory,
by the same rule as the file tools (:mod:`actors.files.confine`: ``..`` and
symlinks are judged by where they really lead), from any client, local or
remote. The server's own files (the data directory, the database and its
companions) are :class:`Withheld` even when they lie inside that directory.
A refusal is an ``InvalidRequestError`` (kind ``file``) that names the field
and the reason, never the file's contents; nothing is admitted.
"""

from __future__ import annotations

import base64
import binascii
import os
import stat
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from actors.files.confine import PathRefused, confined, inside
from protocol.errors import InvalidRequestError
from protocol.requests import FileInput

__all__ = ["MAX_FILE_BYTES", "Blocking", "Withheld", "materialise"]

#: Runs a short blocking call off the loop (the runtime passes its tool-thread runner).
Blocking = Callable[..., Awaitable[Any]]

MAX_FILE_BYTES: Final = 20 * 1024 * 1024


@attrs.frozen(kw_only=True)
class Withheld:
    """Server files no attachment may read, wherever the session's directory is."""

    #: Nothing at or below these (the data directory).
    directories: tuple[Path, ...] = ()
    #: These files and their companions (``-wal``, ``-shm``, ``.lock`` …): the database.
    files: tuple[Path, ...] = ()

    def covers(self, target: Path) -> bool:
        """Whether the resolved ``target`` is withheld (blocking: resolves the roots)."""
        if inside(target, (d.resolve() for d in self.directories)):
            return True
        for file in self.files:
            real = file.resolve()
            if target.parent == real.parent and target.name.startswith(real.name):
                return True
        return False


def _compact(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


async def materialise(
    files: Sequence[FileInput],
    blocking: Blocking,
    *,
    directory: Path,
    withheld: Withheld | None = None,
) -> list[dict[str, Any]]:
    """Turn attachments into inline base64 data, as they are admitted.

    ``file:`` URLs are confined to ``directory`` (the session's) minus ``withheld``.
    """
    withheld = withheld or Withheld()
    out = []
    for index, file in enumerate(files):
        field = f"files[{index}]"
        if file.data is not None:
            data = _checked_base64(file.data, field=f"{field}.data")
            source: dict[str, Any] = {"type": "inline"}
        else:
            assert file.uri is not None
            data = await _read_uri(file.uri, blocking, directory, withheld, field=f"{field}.uri")
            source = {"type": "uri", "uri": file.uri}
        out.append(_compact({"data": data, "mime": file.mime, "source": source, "name": file.name}))
    return out


def _checked_base64(text: str, *, field: str) -> str:
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequestError(
            f"{field} is not valid base64", kind="file", field=field
        ) from None
    if len(raw) > MAX_FILE_BYTES:
        raise InvalidRequestError(
            f"{field} is larger than {MAX_FILE_BYTES} bytes", kind="file", field=field
        )
    return text


async def _read_uri(
    uri: str, blocking: Blocking, directory: Path, withheld: Withheld, *, field: str
) -> str:
    parsed = urllib.parse.urlsplit(uri)
    if parsed.scheme == "data":
        header, sep, body = parsed.path.partition(",")
        if not sep or not header.endswith(";base64"):
            raise InvalidRequestError(
                f"{field}: only base64 data URLs are accepted", kind="file", field=field
            )
        return _checked_base64(body, field=field)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise InvalidRequestError(
                f"{field}: file URLs must name a local file", kind="file", field=field
            )
        path = urllib.parse.unquote(parsed.path)
        try:
            raw: bytes = await blocking(_read_confined, directory, path, withheld)
        except PathRefused as exc:
            raise InvalidRequestError(
                f"{field}: {path!r} is refused: {exc.message}", kind="file", field=field
            ) from None
        except OSError as exc:
            raise InvalidRequestError(
                f"{field}: cannot read {path!r}: {exc.strerror}", kind="file", field=field
            ) from None
        return base64.b64encode(raw).decode("ascii")
    raise InvalidRequestError(
        f"{field}: unsupported scheme {parsed.scheme!r} (use file: or data:)",
        kind="file",
        field=field,
    )


def _read_confined(directory: Path, raw: str, withheld: Withheld) -> bytes:
    target = confined(directory, raw)
    if withheld.covers(target):
        raise PathRefused("it belongs to the server", reason="outside")
    # NOFOLLOW: the path was resolved, so a symlink here was swapped in since.
    # NONBLOCK: a FIFO must not hold the admission; it is refused just below.
    fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PathRefused("not a regular file", reason="invalid")
        data = f.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise OSError(27, "file too large")
    return data
