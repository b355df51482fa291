"""Server-sent event streams: framing, and the session log over HTTP.

Frames are ``id: <seq>`` (durable events only), ``event: <type>``,
``data: <json>`` and a blank line; ``: ping`` comments keep idle connections
alive.

``session.log`` (a session's durable events): verify the session, then follow
its log with :class:`~storage.follow.LogFollow` (subscribe before the
watermark, replay in pages, live from the log itself); one ``log.synced``
marker separates the replay from what follows. ``Last-Event-ID`` resumes like
``after``. A session deleted while followed ends the stream after its
``session.deleted`` event. The instance feed lives in :mod:`server.feed`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Final

import orjson
from aiohttp import web

from actors.runtime import Runtime
from protocol.errors import InvalidRequestError
from protocol.events import envelope
from protocol.operations import LogQuery
from storage import RecordedEvent
from storage.follow import LogFollow

__all__ = ["PING", "StreamSettings", "frame", "open_stream", "session_log"]

PING: Final = b": ping\n\n"


class StreamSettings:
    def __init__(self, *, heartbeat_s: float = 15.0, queue_frames: int = 4096) -> None:
        self.heartbeat_s = heartbeat_s
        self.queue_frames = queue_frames
        self.closing = asyncio.Event()


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
    if not last.strip().isdigit():
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
    try:
        async with LogFollow(runtime.store, session_id, after=after, follow=query.follow) as log:
            response = await open_stream(request)
            async for page in log.replay():
                if chunk := _records_chunk(page):
                    await response.write(chunk)
            synced: dict[str, Any] = {"type": "log.synced", "aggregateID": session_id}
            if log.watermark:
                synced["seq"] = log.watermark
            await response.write(frame(orjson.dumps(synced), event="log.synced"))
            if not query.follow or log.deleted:
                return response
            async for page in log.changes(settings.heartbeat_s):
                if settings.closing.is_set():
                    break
                chunk = _records_chunk(page) if page else PING
                if chunk:
                    await response.write(chunk)
        return response
    except ConnectionResetError:
        # The reader went away: the normal end of a followed stream.
        if response is None:
            raise
        return response
