"""Prompt attachments: what a client attaches, turned into inline data at admission.

An attachment is inline base64 (``data`` or a ``data:…;base64,`` URL) or a
``file:`` URL read once, at admission, so the log holds what the model will
see even if the file changes later.
"""

from __future__ import annotations

import base64
import binascii
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from protocol.errors import InvalidRequestError
from protocol.requests import FileInput

__all__ = ["MAX_FILE_BYTES", "Blocking", "materialise"]

#: Runs a short blocking call off the loop (the runtime passes its tool-thread runner).
Blocking = Callable[..., Awaitable[Any]]

MAX_FILE_BYTES: Final = 20 * 1024 * 1024


def _compact(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


async def materialise(files: Sequence[FileInput], blocking: Blocking) -> list[dict[str, Any]]:
    """Turn attachments into inline base64 data, as they are admitted."""
    out = []
    for index, file in enumerate(files):
        field = f"files[{index}]"
        if file.data is not None:
            data = _checked_base64(file.data, field=f"{field}.data")
            source: dict[str, Any] = {"type": "inline"}
        else:
            assert file.uri is not None
            data = await _read_uri(file.uri, blocking, field=f"{field}.uri")
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


async def _read_uri(uri: str, blocking: Blocking, *, field: str) -> str:
    parsed = urllib.parse.urlsplit(uri)
    if parsed.scheme == "data":
        header, sep, body = parsed.path.partition(",")
        if not sep or not header.endswith(";base64"):
            raise InvalidRequestError(
                f"{field}: only base64 data URLs are accepted", kind="file", field=field
            )
        return _checked_base64(body, field=field)
    if parsed.scheme == "file":
        path = Path(urllib.parse.unquote(parsed.path))
        try:
            raw: bytes = await blocking(_read_bounded, path)
        except OSError as exc:
            raise InvalidRequestError(
                f"{field}: cannot read {path}: {exc.strerror}", kind="file", field=field
            ) from None
        return base64.b64encode(raw).decode("ascii")
    raise InvalidRequestError(
        f"{field}: unsupported scheme {parsed.scheme!r} (use file: or data:)",
        kind="file",
        field=field,
    )


def _read_bounded(path: Path) -> bytes:
    with path.open("rb") as f:
        raw = f.read(MAX_FILE_BYTES + 1)
    if len(raw) > MAX_FILE_BYTES:
        raise OSError(27, "file too large")
    return raw
