"""Incremental ``text/event-stream`` decoding, as the HTML spec describes it.

The one decoder of the project: the client's streams (:mod:`protocol.client`)
and the provider adapters (:mod:`actors.llm`) both feed it. Pure: bytes in,
:class:`SSEFrame` values out (:func:`parse_frame` turns one into an
:class:`SSEEvent` with its JSON data).

Bytes arrive cut anywhere (inside a line, inside a UTF-8 sequence, between
the CR and LF of a CRLF), so the decoder keeps the unfinished line and
decodes only whole lines. Lines end with CRLF, LF or CR; a leading BOM is
dropped; a line starting with ``:`` is a comment (a heartbeat or keep-alive);
``field: value`` loses exactly one space after the colon; several ``data``
lines join with ``"\\n"``; a blank line ends a frame. The unfinished line is
bounded by :data:`MAX_LINE_BYTES` (:class:`SSELineTooLongError` past it).

When the stream ends (:meth:`SSEDecoder.end`), a line cut by a final CR is
complete; an unterminated line is a cut in the middle of a frame and is
dropped. A frame still open is dropped too, as the spec says, unless the
caller asks for it (``dispatch_open``: a provider may omit the blank line
after its last event).

Unlike a browser's ``lastEventId``, :attr:`SSEFrame.id` is the id *this frame*
carried (``None`` for live-only events), so a consumer never mistakes a
live-only event for the durable one before it; :attr:`SSEDecoder.last_event_id`
keeps the spec's sticky value.
"""

from __future__ import annotations

from typing import Any, Final

import attrs
import orjson

__all__ = [
    "MAX_LINE_BYTES",
    "SSEDecodeError",
    "SSEDecoder",
    "SSEEvent",
    "SSEFrame",
    "SSELineTooLongError",
    "parse_frame",
]

#: A line longer than this is not an event but a broken or hostile stream;
#: the decoder's buffer is bounded by it.
MAX_LINE_BYTES: Final = 16 * 1024 * 1024

_BOM: Final = b"\xef\xbb\xbf"


@attrs.frozen(kw_only=True)
class SSEEvent:
    """One server-sent event: ``id`` (the durable seq, if any), ``event`` type, JSON ``data``."""

    id: int | None = None
    event: str | None = None
    data: Any = None


@attrs.frozen(kw_only=True)
class SSEFrame:
    """One frame as sent: ``data`` is the joined text of its data lines."""

    id: int | None = None
    event: str | None = None
    data: str


class SSEDecodeError(ValueError):
    """A frame's data is not JSON."""


class SSELineTooLongError(ValueError):
    """An SSE line exceeded :data:`MAX_LINE_BYTES`."""


def parse_frame(frame: SSEFrame) -> SSEEvent:
    """The frame with its data parsed as JSON."""
    try:
        value = orjson.loads(frame.data)
    except orjson.JSONDecodeError as exc:
        raise SSEDecodeError(f"event data is not JSON: {exc}: {frame.data[:200]!r}") from None
    return SSEEvent(id=frame.id, event=frame.event, data=value)


class SSEDecoder:
    """Feed it chunks as they arrive; it returns the frames they complete."""

    __slots__ = ("_buffer", "_data", "_event", "_id", "_started", "last_event_id")

    def __init__(self) -> None:
        self._buffer = b""
        self._started = False
        self._data: list[str] = []
        self._event: str | None = None
        self._id: int | None = None
        self.last_event_id: str | None = None

    def feed(self, chunk: bytes) -> list[SSEFrame]:
        buffer = self._buffer + chunk if self._buffer else chunk
        if b"\r" in buffer:
            # A trailing CR may be the first half of a CRLF: keep it for later.
            held = buffer.endswith(b"\r")
            if held:
                buffer = buffer[:-1]
            lines = buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
            rest = lines.pop()
            if held:
                rest += b"\r"
        else:
            lines = buffer.split(b"\n")
            rest = lines.pop()
        if len(rest) > MAX_LINE_BYTES:
            raise SSELineTooLongError(f"an SSE line is longer than {MAX_LINE_BYTES} bytes")
        self._buffer = rest
        frames: list[SSEFrame] = []
        for line in lines:
            self._line(line, frames)
        return frames

    def end(self, *, dispatch_open: bool = False) -> list[SSEFrame]:
        """The stream ended: complete a line cut by a final CR, drop an unfinished
        one, and drop the open frame (or, with ``dispatch_open``, dispatch it)."""
        frames: list[SSEFrame] = []
        if self._buffer.endswith(b"\r"):
            frames = self.feed(b"\n")
        if dispatch_open and not self._buffer:
            self._line(b"", frames)
        self._buffer = b""
        self._data, self._event, self._id = [], None, None
        return frames

    def _line(self, raw: bytes, frames: list[SSEFrame]) -> None:
        if not self._started:
            self._started = True
            raw = raw.removeprefix(_BOM)
        if not raw:
            if self._data:
                frames.append(
                    SSEFrame(id=self._id, event=self._event or None, data="\n".join(self._data))
                )
                self._data = []
            self._event = None
            self._id = None
            return
        if raw[0] == 0x3A:  # ":" starts a comment
            return
        name, colon, value = raw.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        # The spec decodes with replacement: a bad byte spoils a value, not the stream.
        if name == b"data":
            self._data.append(value.decode("utf-8", "replace"))
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")
        elif name == b"id" and b"\0" not in value:
            text = value.decode("utf-8", "replace")
            self.last_event_id = text
            self._id = _seq(text)
        # "retry" and unknown fields are ignored: no reader here reconnects on its own.


def _seq(value: str) -> int | None:
    # Durable frames carry their seq; anything else is not a position one can resume from.
    return int(value) if value.isascii() and value.isdigit() else None
