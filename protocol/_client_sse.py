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

from typing import Any, Final

import attrs
import orjson

__all__ = [
    "RawFrame",
    "SSEDecodeError",
    "SSEDecoder",
    "SSEEvent",
    "SSEFrame",
    "parse_frame",
    "parse_raw",
]


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


def parse_raw(raw: RawFrame) -> SSEEvent:
    """A frame as :meth:`SSEDecoder.feed_raw` gives it, its data parsed as JSON.

    orjson reads the bytes as they came; only data that is not valid UTF-8 is
    decoded with replacement first (the spec's decoding), then parsed.
    """
    frame_id, event, data = raw
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        return parse_frame(SSEFrame(id=frame_id, event=event, data=data.decode("utf-8", "replace")))
    return SSEEvent(id=frame_id, event=event, data=value)


#: (id, event type, data bytes): a frame before its data is decoded.
RawFrame = tuple[int | None, str | None, bytes]

_BOM: Final = b"\xef\xbb\xbf"
#: Event type names decoded once each; a stream names a few dozen at most.
_NAMES_MAX: Final = 256


class SSEDecoder:
    """Feed it chunks as they arrive; it returns the frames they complete.

    Works on bytes: a chunk's complete lines are cut with one ``split``, a
    ``data`` value stays bytes (joined, for several lines, with ``b"\\n"``)
    until :func:`parse_raw` hands it to orjson, and an event type is decoded
    once per name.
    """

    def __init__(self) -> None:
        #: The unfinished line, in the pieces it came in (joined once a line end
        #: arrives: a long line is not copied again with every chunk).
        self._parts: list[bytes] = []
        self._started = False
        self._data: list[bytes] = []
        self._event: str | None = None
        self._id: int | None = None
        self._last_id: bytes | None = None
        self._names: dict[bytes, str] = {}

    @property
    def last_event_id(self) -> str | None:
        """The spec's sticky last event id: the latest ``id`` field, whatever frame it was in."""
        last = self._last_id
        return None if last is None else last.decode("utf-8", "replace")

    def feed(self, chunk: bytes) -> list[SSEFrame]:
        return [
            SSEFrame(id=i, event=e, data=d.decode("utf-8", "replace"))
            for i, e, d in self.feed_raw(chunk)
        ]

    def feed_raw(self, chunk: bytes) -> list[RawFrame]:
        """The frames ``chunk`` completes, their data still bytes (see :func:`parse_raw`)."""
        if b"\n" not in chunk and b"\r" not in chunk:
            if chunk:
                self._parts.append(chunk)
            return []
        parts = self._parts
        buffer = b"".join((*parts, chunk)) if parts else chunk
        hold = b""
        if b"\r" in buffer:
            # CR and CRLF end lines too. A trailing CR may be the first half of
            # a CRLF split across two chunks: it waits for the next byte.
            if buffer.endswith(b"\r"):
                buffer, hold = buffer[:-1], b"\r"
            buffer = buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buffer.split(b"\n")
        rest = lines.pop() + hold
        self._parts = [rest] if rest else []
        if not lines:
            return []
        if not self._started:
            self._started = True
            lines[0] = lines[0].removeprefix(_BOM)
        frames: list[RawFrame] = []
        names = self._names
        data, event, frame_id = self._data, self._event, self._id
        for line in lines:
            # The server's own lines first ("id: ", "event: ", "data: "), each
            # told by one prefix test; anything else goes the general way.
            if not line:
                if data:
                    joined = data[0] if len(data) == 1 else b"\n".join(data)
                    frames.append((frame_id, event, joined))
                    data = []
                event = frame_id = None
            elif line.startswith(b"data: "):
                data.append(line[6:])
            elif line.startswith(b"id: ") and line[4:].isdigit():
                self._last_id = line[4:]
                frame_id = int(self._last_id)
            elif line.startswith(b"event: ") and (known := names.get(line)) is not None:
                event = known
            elif line[0] != 0x3A:  # ":" starts a comment (the server's ping)
                name, colon, value = line.partition(b":")
                if colon and value.startswith(b" "):
                    value = value[1:]
                if name == b"data":
                    data.append(value)
                elif name == b"event":
                    event = self._name(line, value)
                elif name == b"id" and b"\0" not in value:
                    self._last_id = value
                    frame_id = int(value) if value.isdigit() else None
                # "retry" and unknown fields are ignored: this client never reconnects on its own.
        self._data, self._event, self._id = data, event, frame_id
        return frames

    def end(self) -> list[SSEFrame]:
        """The stream ended: complete a line cut by a final CR; drop an unfinished frame."""
        return [
            SSEFrame(id=i, event=e, data=d.decode("utf-8", "replace")) for i, e, d in self.end_raw()
        ]

    def end_raw(self) -> list[RawFrame]:
        """:meth:`end`, its frames as :meth:`feed_raw` gives them."""
        frames: list[RawFrame] = []
        if self._parts and self._parts[-1].endswith(b"\r"):
            frames = self.feed_raw(b"\n")
        self._parts = []
        self._data, self._event, self._id = [], None, None
        return frames

    def _name(self, line: bytes, value: bytes) -> str | None:
        """The event type ``value`` (from ``line``) as text; remembered by its whole line."""
        name = value.decode("utf-8", "replace") or None
        if len(self._names) < _NAMES_MAX and name is not None:
            self._names[line] = name
        return name
