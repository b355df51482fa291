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
    "RawFrame",
    "SSEDecodeError",
    "SSEDecoder",
    "SSEEvent",
    "SSEFrame",
    "SSELineTooLongError",
    "parse_frame",
    "parse_raw",
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

#: Event type names decoded once each (by their whole line); a stream names a few dozen.
_NAMES_MAX: Final = 256


def _text(raw: RawFrame) -> SSEFrame:
    frame_id, event, data = raw
    return SSEFrame(id=frame_id, event=event, data=data.decode("utf-8", "replace"))


class SSEDecoder:
    """Feed it chunks as they arrive; it returns the frames they complete.

    :meth:`feed_raw` keeps a frame's data as bytes (joined, for several lines,
    with ``b"\\n"``) for :func:`parse_raw` to hand to orjson as they are; an
    event type is decoded once per name; the server's own field lines are told
    by one prefix test each.
    """

    __slots__ = ("_buffer", "_data", "_event", "_id", "_last_id", "_names", "_started")

    def __init__(self) -> None:
        self._buffer = b""
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
        return [_text(raw) for raw in self.feed_raw(chunk)]

    def feed_raw(self, chunk: bytes) -> list[RawFrame]:
        """The frames ``chunk`` completes, their data still bytes (see :func:`parse_raw`)."""
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
        if not lines:
            return []
        if not self._started:
            self._started = True
            lines[0] = lines[0].removeprefix(_BOM)
        return self._lines(lines)

    def end(self, *, dispatch_open: bool = False) -> list[SSEFrame]:
        """The stream ended: complete a line cut by a final CR, drop an unfinished
        one, and drop the open frame (or, with ``dispatch_open``, dispatch it)."""
        return [_text(raw) for raw in self.end_raw(dispatch_open=dispatch_open)]

    def end_raw(self, *, dispatch_open: bool = False) -> list[RawFrame]:
        """:meth:`end`, its frames as :meth:`feed_raw` gives them."""
        frames: list[RawFrame] = []
        if self._buffer.endswith(b"\r"):
            frames = self.feed_raw(b"\n")
        if dispatch_open and not self._buffer:
            frames += self._lines([b""])
        self._buffer = b""
        self._data, self._event, self._id = [], None, None
        return frames

    def _lines(self, lines: list[bytes]) -> list[RawFrame]:
        frames: list[RawFrame] = []
        names = self._names
        data, event, frame_id = self._data, self._event, self._id
        for line in lines:
            if not line:
                if data:
                    frames.append(
                        (frame_id, event, data[0] if len(data) == 1 else b"\n".join(data))
                    )
                    data = []
                event = frame_id = None
            elif line.startswith(b"data: "):
                data.append(line[6:])
            elif line.startswith(b"id: ") and line[4:].isdigit():
                self._last_id = line[4:]
                frame_id = int(self._last_id)
            elif line.startswith(b"event: ") and (known := names.get(line)) is not None:
                event = known
            elif line[0] != 0x3A:  # ":" starts a comment
                name, colon, value = line.partition(b":")
                if colon and value[:1] == b" ":
                    value = value[1:]
                # The spec decodes with replacement: a bad byte spoils a value, not the stream.
                if name == b"data":
                    data.append(value)
                elif name == b"event":
                    event = value.decode("utf-8", "replace") or None
                    if event is not None and len(names) < _NAMES_MAX:
                        names[line] = event
                elif name == b"id" and b"\0" not in value:
                    self._last_id = value
                    frame_id = _seq(value.decode("utf-8", "replace"))
                # "retry" and unknown fields are ignored: no reader here reconnects on its own.
        self._data, self._event, self._id = data, event, frame_id
        return frames


def _seq(value: str) -> int | None:
    # Durable frames carry their seq; anything else is not a position one can resume from.
    return int(value) if value.isascii() and value.isdigit() else None
