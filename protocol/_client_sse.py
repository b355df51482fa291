"""Incremental ``text/event-stream`` decoding, as the HTML spec describes it.

Pure: bytes in, :class:`SSEFrame` values out (:func:`parse_frame` turns one into
an :class:`SSEEvent` with its JSON data). Lines end with CRLF, LF or CR;
a line starting with ``:`` is a comment (the server's ``: ping`` heartbeat);
``field: value`` loses exactly one space after the colon; several ``data``
lines join with ``"\\n"``; a blank line ends a frame. A frame still open when
the stream ends is dropped, as the spec says.

Unlike a browser's ``lastEventId``, :attr:`SSEEvent.id` is the id *this frame*
carried (``None`` for live-only events), so a consumer never mistakes a
live-only event for the durable one before it; :attr:`SSEDecoder.last_event_id`
keeps the spec's sticky value.
"""

from __future__ import annotations

from typing import Any

import attrs
import orjson

__all__ = ["SSEDecodeError", "SSEDecoder", "SSEEvent", "SSEFrame", "parse_frame"]


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


def parse_frame(frame: SSEFrame) -> SSEEvent:
    """The frame with its data parsed as JSON."""
    try:
        value = orjson.loads(frame.data)
    except orjson.JSONDecodeError as exc:
        raise SSEDecodeError(f"event data is not JSON: {exc}: {frame.data[:200]!r}") from None
    return SSEEvent(id=frame.id, event=frame.event, data=value)


class SSEDecoder:
    """Feed it chunks as they arrive; it returns the frames they complete."""

    def __init__(self) -> None:
        self._buffer = b""
        self._started = False
        self._data: list[str] = []
        self._event: str | None = None
        self._id: int | None = None
        self.last_event_id: str | None = None

    def feed(self, chunk: bytes) -> list[SSEFrame]:
        buffer = self._buffer + chunk
        frames: list[SSEFrame] = []
        start = 0
        while (cut := _line_end(buffer, start)) is not None:
            end, after = cut
            frame = self._line(buffer[start:end])
            if frame is not None:
                frames.append(frame)
            start = after
        self._buffer = buffer[start:]
        return frames

    def end(self) -> list[SSEFrame]:
        """The stream ended: complete a line cut by a final CR; drop an unfinished frame."""
        frames: list[SSEFrame] = []
        if self._buffer.endswith(b"\r"):
            frames = self.feed(b"\n")
        self._buffer = b""
        self._data, self._event, self._id = [], None, None
        return frames

    def _line(self, raw: bytes) -> SSEFrame | None:
        # The spec decodes with replacement: a bad byte spoils a value, not the stream.
        line = raw.decode("utf-8", "replace")
        if not self._started:
            self._started = True
            line = line.removeprefix("\ufeff")
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self.last_event_id = value
            self._id = _seq(value)
        # "retry" and unknown fields are ignored: this client never reconnects on its own.
        return None

    def _dispatch(self) -> SSEFrame | None:
        data, event, frame_id = self._data, self._event, self._id
        self._data, self._event, self._id = [], None, None
        if not data:
            return None
        return SSEFrame(id=frame_id, event=event or None, data="\n".join(data))


def _line_end(buffer: bytes, start: int) -> tuple[int, int] | None:
    """(end of the line at ``start``, start of the next), or None while it is incomplete."""
    lf = buffer.find(b"\n", start)
    cr = buffer.find(b"\r", start)
    if cr == -1 or (lf != -1 and lf < cr):
        return None if lf == -1 else (lf, lf + 1)
    if cr + 1 == len(buffer):
        # A trailing CR may be the first half of a CRLF split across two chunks.
        return None
    return (cr, cr + 2) if buffer[cr + 1] == 0x0A else (cr, cr + 1)


def _seq(value: str) -> int | None:
    # Durable frames carry their seq; anything else is not a position one can resume from.
    return int(value) if value.isascii() and value.isdigit() else None
