"""Server-sent event streams: the session log and the instance feed.

Frames are ``id: <seq>`` (durable events only), ``event: <type>``,
``data: <json>`` and a blank line; ``: ping`` comments keep idle connections
alive.

``session.log`` (a session's durable events): verify the session; with
``follow``, register for commit notifications *before* reading; capture the
watermark (latest seq); replay ``after < seq <= watermark`` in pages of 512;
send one ``log.synced`` marker; then, following, read again from the last
sent seq on every notification. The notification is only a doorbell (a flag,
not a queue), so a slow reader never buffers events in memory and can never
miss one: everything it sends comes from the log itself, deduplicated by seq.
``Last-Event-ID`` resumes like ``after``. A session deleted while followed
ends the stream after its ``session.deleted`` event.

``event.subscribe`` (the instance feed): ``server.connected`` first, then
every public event, durable and live-only. Each event is encoded once for all
connections; each connection has its own bounded queue, and a connection whose
queue overflows is closed alone. ``server.instance.disposed`` goes to every
connection before the server shuts down. No replay.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable, Sequence
from typing import Any, Final

import orjson
from aiohttp import web

from actors.bus import Envelope, EventBus
from actors.runtime import Runtime
from protocol.errors import InvalidRequestError
from protocol.events import envelope
from protocol.operations import LogQuery
from storage import RecordedEvent, now_ms

__all__ = ["EventFeed", "StreamSettings", "frame", "session_log"]

PAGE: Final = 512
PING: Final = b": ping\n\n"
_SEQ: Final = re.compile(r"[0-9]{1,18}")


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


async def _open(request: web.Request) -> web.StreamResponse:
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
    bell = asyncio.Event()

    def ring(records: Sequence[RecordedEvent]) -> None:
        if any(r.aggregate_id == session_id for r in records):
            bell.set()

    # Subscribe before reading the watermark: nothing committed after it is missed.
    unsubscribe = runtime.store.subscribe(ring) if query.follow else None
    response: web.StreamResponse | None = None
    try:
        watermark = await runtime.store.last_seq(session_id)
        response = await _open(request)
        sent, deleted = await _replay(runtime, response, session_id, after, watermark)
        synced: dict[str, Any] = {"type": "log.synced", "aggregateID": session_id}
        if watermark:
            synced["seq"] = watermark
        await response.write(frame(orjson.dumps(synced), event="log.synced"))
        if not query.follow or deleted:
            return response
        sent = max(sent, watermark)
        while not settings.closing.is_set():
            try:
                await asyncio.wait_for(bell.wait(), settings.heartbeat_s)
            except TimeoutError:
                await response.write(PING)
                continue
            bell.clear()
            sent, deleted = await _replay(runtime, response, session_id, sent, None)
            if deleted:
                break
        return response
    except ConnectionResetError:
        # The reader went away: the normal end of a followed stream.
        if response is None:
            raise
        return response
    finally:
        if unsubscribe is not None:
            unsubscribe()


async def _replay(
    runtime: Runtime,
    response: web.StreamResponse,
    session_id: str,
    after: int,
    upto: int | None,
) -> tuple[int, bool]:
    """Send events ``after < seq <= upto`` (or all); return the last seq sent, deleted?"""
    cursor = after
    while upto is None or cursor < upto:
        records = await runtime.store.read(session_id, after=cursor, limit=PAGE)
        if upto is not None:
            records = [r for r in records if r.seq <= upto]
        if not records:
            break
        chunk = b"".join(f for r in records if (f := _record_frame(r)) is not None)
        if chunk:
            await response.write(chunk)
        cursor = records[-1].seq
        if any(r.type.startswith("session.deleted.") for r in records):
            return cursor, True
        if len(records) < PAGE:
            break
    return cursor, False


class _Connection:
    def __init__(self, capacity: int) -> None:
        self.queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=capacity)
        self.overflowed = asyncio.Event()


class EventFeed:
    """One encoding of the bus for many ``event.subscribe`` connections."""

    def __init__(self, bus: EventBus, settings: StreamSettings) -> None:
        self._bus = bus
        self._settings = settings
        self._connections: set[_Connection] = set()
        # Subscribed only while someone listens: with no connection, committed
        # events are not turned into envelopes and frames for nobody.
        self._unsubscribe: Callable[[], None] | None = None

    def close(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def dispose(self) -> None:
        """Tell every connection the instance is going away (bypasses capacity)."""
        message = {"type": "server.instance.disposed", "created": now_ms(), "data": {}}
        data = frame(orjson.dumps(message), event="server.instance.disposed")
        for connection in self._connections:
            with contextlib.suppress(asyncio.QueueFull):
                connection.queue.put_nowait(data)
            if connection.queue.full():
                connection.overflowed.set()

    def _publish(self, message: Envelope) -> None:
        if not self._connections:
            return
        durable = message.get("durable")
        data = frame(
            orjson.dumps(message),
            event=message["type"],
            id=durable["seq"] if durable else None,
        )
        for connection in self._connections:
            try:
                connection.queue.put_nowait(data)
            except asyncio.QueueFull:
                connection.overflowed.set()  # this connection alone is dropped

    async def stream(self, request: web.Request) -> web.StreamResponse:
        connection = _Connection(self._settings.queue_frames)
        self._connections.add(connection)
        if self._unsubscribe is None:
            self._unsubscribe = self._bus.subscribe(self._publish)
        response: web.StreamResponse | None = None
        try:
            response = await _open(request)
            hello = {"type": "server.connected", "created": now_ms(), "data": {}}
            await response.write(frame(orjson.dumps(hello), event="server.connected"))
            while not connection.overflowed.is_set():
                try:
                    data = await asyncio.wait_for(
                        connection.queue.get(), self._settings.heartbeat_s
                    )
                except TimeoutError:
                    await response.write(PING)
                    continue
                await response.write(data)
                if data.startswith(b"event: server.instance.disposed"):
                    break
            return response
        except ConnectionResetError:
            if response is None:
                raise
            return response  # the subscriber went away
        finally:
            self._connections.discard(connection)
            if not self._connections:
                self.close()

    def __len__(self) -> int:
        return len(self._connections)
