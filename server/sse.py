"""Server-sent event streams: framing, and the session log over HTTP.

Frames are ``id: <seq>`` (durable events only), ``event: <type>``,
``data: <json>`` and a blank line; ``: ping`` comments keep idle connections
alive.

``session.log`` (a session's durable events): verify the session, then follow
its log with a :class:`~storage.follow.LogFollow` of the runtime's
``follows`` dispatcher (subscribe before the watermark, replay in pages, live
from the log itself, rung only by commits to this session); one ``log.synced``
marker separates the replay from what follows. ``Last-Event-ID`` resumes like
``after``. A session deleted while followed ends the stream after its
``session.deleted`` event; the server's shutdown ends every followed stream
at once (not at its next event or heartbeat). A reader whose write makes no
progress for ``write_timeout_s`` is disconnected. The instance feed lives in :mod:`server.feed`.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Sequence
from typing import Any, Final

import orjson
from aiohttp import web

from actors.runtime import Runtime
from protocol.errors import InvalidRequestError
from protocol.events import envelope
from protocol.operations import LogQuery
from storage import RecordedEvent, StorageError
from storage.clock import SYSTEM, Clock

__all__ = [
    "PING",
    "Sender",
    "StalledWriteError",
    "StreamSettings",
    "frame",
    "open_stream",
    "session_log",
]

log_ = logging.getLogger("sessionrt.server.sse")

PING: Final = b": ping\n\n"
_SEQ: Final = re.compile(r"[0-9]{1,18}")


#: One write never carries more than this, so "has the write progressed?" is
#: asked at least once per this many bytes (a whole backlog in one write would
#: have to drain completely before its timeout, however steadily it moved).
WRITE_SLICE: Final = 256 * 1024


class StalledWriteError(Exception):
    """A write to a stream's peer made no progress within its timeout."""


class StreamSettings:
    """What every stream of one app shares: its bounds and the shutdown signal.

    ``close()`` (the app's shutdown) reaches every open stream at once: each
    registered closer runs, so a follower waiting for the next event or
    heartbeat ends now, and a write in flight gets ``close_grace_s`` at most.
    """

    def __init__(
        self,
        *,
        heartbeat_s: float = 15.0,
        queue_bytes: int = 8 * 1024 * 1024,
        write_timeout_s: float = 10.0,
        close_grace_s: float = 0.5,
        clock: Clock = SYSTEM,
    ) -> None:
        self.heartbeat_s = heartbeat_s
        #: What the heartbeat interval is measured on (the runtime's clock).
        self.clock = clock
        self.queue_bytes = queue_bytes
        self.write_timeout_s = write_timeout_s
        self.close_grace_s = close_grace_s
        self.closing = asyncio.Event()
        self._closers: set[Callable[[], None]] = set()
        #: Session-log streams open now (for /metrics).
        self.open_logs = 0

    def on_close(self, closer: Callable[[], None]) -> Callable[[], None]:
        """Run ``closer`` when the streams close (at once if they have); returns the undo."""
        if self.closing.is_set():
            closer()
            return lambda: None
        self._closers.add(closer)
        return lambda: self._closers.discard(closer)

    def close(self) -> None:
        self.closing.set()
        closers, self._closers = self._closers, set()
        for closer in closers:
            closer()


class Sender:
    """Writes to one stream, each slice under a deadline that shutdown can shorten."""

    def __init__(self, response: web.StreamResponse, request: web.Request, timeout_s: float):
        self._response = response
        self._request = request
        self.timeout_s = timeout_s
        self._deadline: asyncio.Timeout | None = None
        #: The last slice handed over ended inside a frame (one frame larger than a slice).
        self.partial = False

    async def write(self, data: bytes) -> None:
        """Raises :class:`StalledWriteError` when a slice does not drain in time.

        ``data`` is whole frames. Slices end on a frame boundary unless one
        frame is larger than a slice; :attr:`partial` says whether what the
        peer has been handed so far ends inside a frame.
        """
        view = memoryview(data)
        start, size = 0, len(data)
        while start < size:
            end = start + WRITE_SLICE
            if end < size:
                boundary = data.rfind(b"\n\n", start, end)
                if boundary >= 0:
                    end = boundary + 2
            else:
                end = size
            try:
                async with asyncio.timeout(self.timeout_s) as deadline:
                    self._deadline = deadline
                    # aiohttp hands the whole slice to the transport before it
                    # waits for the drain: from here on the peer has it all.
                    self.partial = not data.endswith(b"\n\n", start, end)
                    await self._response.write(view[start:end])
            except TimeoutError:
                raise StalledWriteError(f"no progress in {self.timeout_s:g} s") from None
            finally:
                self._deadline = None
            start = end

    def hurry(self, seconds: float) -> None:
        """From now on (the write in flight included) a write gets ``seconds`` at most."""
        self.timeout_s = min(self.timeout_s, seconds)
        deadline = self._deadline
        if deadline is not None:
            when = asyncio.get_running_loop().time() + seconds
            current = deadline.when()
            deadline.reschedule(when if current is None else min(current, when))

    def abort(self) -> None:
        """Drop the connection now, with whatever it could not take."""
        transport = self._request.transport
        if transport is not None:
            transport.abort()


def frame(data: bytes, *, event: str | None = None, id: int | None = None) -> bytes:
    head = b""
    if id is not None:
        head += b"id: %d\n" % id
    if event is not None:
        head += b"event: " + event.encode() + b"\n"
    return head + b"data: " + data + b"\n\n"


def _record_frame(record: RecordedEvent) -> bytes | None:
    if record.event is None:
        return None  # a type this build does not know: skipped, the cursor moves on
    body = envelope(id=record.id, created=record.created, event=record.event, seq=record.seq)
    return frame(orjson.dumps(body), event=record.event.TYPE, id=record.seq)


def _records_chunk(records: Sequence[RecordedEvent]) -> bytes:
    return b"".join(f for r in records if (f := _record_frame(r)) is not None)


async def open_stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        }
    )
    await response.prepare(request)
    return response


def _after(request: web.Request, query: LogQuery) -> int:
    last = request.headers.get("Last-Event-ID")
    if last is None:
        return max(query.after, 0)
    # ASCII digits only, and few enough for SQLite's integer ("²".isdigit() is true).
    if not _SEQ.fullmatch(last.strip()):
        raise InvalidRequestError("Last-Event-ID must be a seq", field="Last-Event-ID")
    return int(last.strip())


async def session_log(
    runtime: Runtime,
    settings: StreamSettings,
    request: web.Request,
    session_id: str,
    query: LogQuery,
) -> web.StreamResponse:
    await runtime.sessions.get(session_id)
    after = _after(request, query)
    response: web.StreamResponse | None = None
    async with runtime.services.follows.follow(session_id, after=after, follow=query.follow) as log:
        sender: Sender | None = None

        def close() -> None:
            log.close()
            if sender is not None:
                sender.hurry(settings.close_grace_s)

        undo = settings.on_close(close)
        settings.open_logs += 1
        try:
            response = await open_stream(request)
            sender = Sender(response, request, settings.write_timeout_s)
            if settings.closing.is_set():
                sender.hurry(settings.close_grace_s)
            async for page in log.replay():
                if chunk := _records_chunk(page):
                    await sender.write(chunk)
            synced: dict[str, Any] = {"type": "log.synced", "aggregateID": session_id}
            if log.watermark:
                synced["seq"] = log.watermark
            await sender.write(frame(orjson.dumps(synced), event="log.synced"))
            if query.follow:
                async for page in log.changes(settings.heartbeat_s, settings.clock):
                    await sender.write(_records_chunk(page) if page else PING)
            return response
        except StalledWriteError as exc:
            # The reader stopped reading: it holds a descriptor and nothing else,
            # since the log itself is the buffer. Its connection goes now.
            log_.info("session log reader of %s dropped: %s", session_id, exc)
            assert sender is not None
            assert response is not None
            sender.abort()
            return response
        except ConnectionResetError:
            # The reader went away: the normal end of a followed stream.
            if response is None:
                raise
            return response
        except StorageError as exc:
            # The log cannot be read for now (its database restarting, say).
            # Before the stream began this is the 503 of any request; once it
            # runs, an error response can no longer be sent, and leaving the
            # stream open would stall the reader: end it with its last chunk,
            # and the reader resumes from its last id.
            if response is None:
                raise
            log_.warning("session log of %s ended: %s", session_id, exc)
            return response
        finally:
            settings.open_logs -= 1
            undo()
