"""Server-sent events from a byte stream cut anywhere: :class:`SSEDecoder`.

Both provider formats stream SSE: OpenAI sends ``data:`` lines only,
Anthropic an ``event:`` line before each ``data:`` line. The transport hands
over bytes at arbitrary boundaries (inside a line, inside a UTF-8 sequence,
between the CR and LF of a CRLF), so the decoder keeps the unfinished line and
decodes only whole lines. Lines end with LF, CRLF or a lone CR; a blank line
dispatches the event; ``:`` lines are comments (keep-alives); several
``data:`` lines of one event are joined with LF, as the SSE specification says.
"""

from __future__ import annotations

from typing import Final

import attrs

__all__ = ["MAX_LINE_BYTES", "SSEDecoder", "SSEEvent", "SSELineTooLongError"]

#: A line longer than this is not a provider's event but a broken or hostile
#: stream; the decoder's buffer is bounded by it.
MAX_LINE_BYTES: Final = 16 * 1024 * 1024


class SSELineTooLongError(Exception):
    """An SSE line exceeded :data:`MAX_LINE_BYTES`."""


@attrs.frozen
class SSEEvent:
    event: str | None
    data: str


class SSEDecoder:
    """Feed bytes, get the complete events they finish."""

    __slots__ = ("_buf", "_data", "_event")

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[str] = []
        self._event: str | None = None

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        buf = self._buf + chunk if self._buf else chunk
        if b"\r" in buf:
            # A trailing CR may be the first half of a CRLF: keep it for later.
            held = buf.endswith(b"\r")
            if held:
                buf = buf[:-1]
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            lines = buf.split(b"\n")
            rest = lines.pop()
            if held:
                rest += b"\r"
        else:
            lines = buf.split(b"\n")
            rest = lines.pop()
        if len(rest) > MAX_LINE_BYTES:
            raise SSELineTooLongError(f"an SSE line is longer than {MAX_LINE_BYTES} bytes")
        self._buf = rest
        out: list[SSEEvent] = []
        for line in lines:
            self._line(line, out)
        return out

    def close(self) -> list[SSEEvent]:
        """The event left open at the end of the stream, if its lines were complete.

        A server may omit the blank line after its last event; an unterminated
        line, though, is a cut in the middle of a frame and is dropped.
        """
        out: list[SSEEvent] = []
        rest, self._buf = self._buf, b""
        if rest == b"\r":
            rest = b""
        if not rest:
            self._line(b"", out)
        self._data = []
        self._event = None
        return out

    def _line(self, line: bytes, out: list[SSEEvent]) -> None:
        if not line:
            if self._data:
                out.append(SSEEvent(self._event, "\n".join(self._data)))
            self._data = []
            self._event = None
            return
        if line[0] == 0x3A:  # ":" starts a comment
            return
        field, colon, value = line.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        if field == b"data":
            self._data.append(value.decode("utf-8", "replace"))
        elif field == b"event":
            self._event = value.decode("utf-8", "replace")
        # id and retry mean nothing to a model call: ignored.
