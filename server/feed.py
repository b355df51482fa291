"""The instance feed (``event.subscribe``): every public event of this process, per connection.

``server.connected`` first, then every public event, durable and live-only.
Each event is encoded once for all connections; each connection has its own
bounded queue, and a connection whose queue overflows is closed alone.
``server.instance.disposed`` goes to every connection before the server shuts
down. No replay.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import orjson
from aiohttp import web

from actors.bus import Envelope, EventBus
from server.sse import PING, StreamSettings, frame, open_stream
from storage import now_ms

__all__ = ["EventFeed"]


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
            response = await open_stream(request)
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
