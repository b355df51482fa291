"""The instance feed (``event.subscribe``): every public event of this process, per connection.

``server.connected`` first, then every public event, durable and live-only;
``: ping`` every heartbeat; ``server.instance.disposed`` before the server
shuts down. No replay.

**Fan-out costs one write per connection per batch, not per event.** What
the bus publishes is encoded once and collected until the end of the current
loop tick (one store commit batch, or every live delta published in one
callback); then one callback joins it into one chunk and hands that same
chunk to every connection. A connection that is *idle* (its task parked,
nothing queued, and the kernel took everything written so far) gets the
chunk written to its transport right there, with no task wake-up; the
connection's own task is woken only when it is behind. So with N subscribers
and B commit batches a second, the loop makes N x B transport writes and no
task switches, whatever the number of events per batch.

A connection that is behind has its own queue bounded by **bytes**
(``queue_bytes``; one chunk larger than the bound is still taken when the
queue is empty), and its task writes whatever is queued in one write (up to
256 KiB per write) through aiohttp, waiting for the transport to drain, so a
subscriber that is briefly behind catches up in a few large writes. Once it
has caught up (queue empty, transport buffer empty) it is idle again.

A connection is dropped alone, after a final ``server.connection.dropped``
frame whose ``data.reason`` says why:

- ``"overflow"``: a chunk would have taken its queue past ``queue_bytes``.
  What it had queued is discarded (it has missed an event anyway) and the
  final frame goes out next.
- ``"stalled"``: a write made no progress for ``write_timeout_s`` (the peer
  stopped reading). The final frame is appended behind what the peer has not
  taken and gets ``write_timeout_s`` more; then the connection is aborted.
  This fires even when the write never returns: the deadline is on the write
  itself, not checked after it.

Shutdown (:meth:`EventFeed.dispose`) reaches every connection at once: what
is queued and ``server.instance.disposed`` go out within ``close_grace_s``;
nothing published after it is sent.

Order per connection is publication order: the chunk of one tick is written
whole, either directly (only when nothing of the connection's is queued or
in flight) or behind what is queued.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import Final, Literal

import orjson
from aiohttp import web

from actors.event_bus import EventBus
from protocol.events import EventEnvelope
from server.sse import PING, Sender, StalledWriteError, StreamSettings, frame, open_stream
from storage import now_ms

__all__ = ["DropReason", "EventFeed"]

log = logging.getLogger("sessionrt.server.feed")

DropReason = Literal["overflow", "stalled"]
#: One write takes at most this much of the queue.
BATCH_BYTES: Final = 256 * 1024
DROPPED: Final = "server.connection.dropped"
DISPOSED: Final = "server.instance.disposed"


def _server_frame(type: str, data: dict[str, object]) -> bytes:
    message = {"type": type, "created": now_ms(), "data": data}
    return frame(orjson.dumps(message), event=type)


def _chunk(data: bytes) -> bytes:
    """``data`` as one HTTP/1.1 chunk (what aiohttp would write for a chunked response)."""
    return b"%x\r\n%b\r\n" % (len(data), data)


class _Connection:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.frames: collections.deque[bytes] = collections.deque()
        self.bytes = 0
        self.wake = asyncio.Event()
        #: The last frame to send; once set, nothing more is queued.
        self.final: bytes | None = None
        self.reason: DropReason | None = None
        self.sender: Sender | None = None
        #: Set while the connection's task is parked with nothing queued: the
        #: feed may then write to ``transport`` itself (see :meth:`direct`).
        self.idle = False
        self.transport: asyncio.Transport | None = None
        self.chunked = True
        #: The peer went away while the connection was idle.
        self.gone = False

    def direct(self, data: bytes, chunk: Callable[[], bytes]) -> bool:
        """Write ``data`` now if the connection is idle and its kernel buffer has room.

        Returns False (nothing written) when it must be queued instead. Only
        an empty transport buffer counts as room: anything left in it means
        the peer is behind, and then the task (which waits for the drain,
        under the stall deadline) takes over.
        """
        transport = self.transport
        if not self.idle or transport is None:
            return False
        if transport.is_closing():
            self.idle = False
            self.gone = True
            self.wake.set()
            return True  # nothing to deliver to any more
        if transport.get_write_buffer_size():
            return False
        transport.write(chunk() if self.chunked else data)
        return True

    def offer(self, data: bytes) -> bool:
        if self.final is not None:
            return True  # ending: nothing more goes out
        if self.frames and self.bytes + len(data) > self.max_bytes:
            return False
        self.frames.append(data)
        self.bytes += len(data)
        self.idle = False
        self.wake.set()
        return True

    def take(self) -> bytes:
        out = [self.frames.popleft()]
        size = len(out[0])
        while self.frames and size + len(self.frames[0]) <= BATCH_BYTES:
            data = self.frames.popleft()
            out.append(data)
            size += len(data)
        self.bytes -= size
        return out[0] if len(out) == 1 else b"".join(out)

    def end(self, final: bytes, *, discard: bool) -> None:
        if self.final is not None:
            return
        if discard:
            self.frames.clear()
            self.bytes = 0
        self.final = final
        self.idle = False
        self.wake.set()


class EventFeed:
    """One encoding of the bus for many ``event.subscribe`` connections."""

    def __init__(self, bus: EventBus, settings: StreamSettings) -> None:
        self._bus = bus
        self._settings = settings
        self._connections: set[_Connection] = set()
        #: Frames published since the last fan-out. Bounded by one loop tick's
        #: publications (one commit batch is at most the store's MAX_BATCH
        #: commands): :meth:`_fan_out` empties it on the next tick.
        self._pending: list[bytes] = []
        self._scheduled = False
        #: Connections dropped so far, by reason (for operators, tests and benchmarks).
        self.drops: collections.Counter[DropReason] = collections.Counter()
        #: Set at the first drop, never cleared.
        self.dropped = asyncio.Event()
        #: Fan-outs so far, and how many connections each one woke (queued
        #: for) instead of writing to directly (for tests and benchmarks).
        self.fan_outs = 0
        self.queued = 0
        # Subscribed only while someone listens: with no connection, committed
        # events are not turned into envelopes and frames for nobody.
        self._unsubscribe: Callable[[], None] | None = None

    def close(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def dispose(self) -> None:
        """Tell every connection the instance is going away, now (bypasses the bound)."""
        self._fan_out()  # what was published before the shutdown goes first
        data = _server_frame(DISPOSED, {})
        grace = self._settings.close_grace_s
        for connection in self._connections:
            connection.end(data, discard=False)
            if connection.sender is not None:
                connection.sender.hurry(grace)

    def _drop(self, connection: _Connection, reason: DropReason, message: str) -> None:
        self._connections.discard(connection)
        connection.reason = reason
        connection.end(_server_frame(DROPPED, {"reason": reason, "message": message}), discard=True)
        self.drops[reason] += 1
        self.dropped.set()
        log.warning("event subscriber dropped (%s): %s", reason, message)

    def _publish(self, message: EventEnvelope) -> None:
        if not self._connections:
            return
        durable = message.get("durable")
        self._pending.append(
            frame(
                orjson.dumps(message),
                event=message["type"],
                id=durable["seq"] if durable else None,
            )
        )
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._fan_out)

    def _fan_out(self) -> None:
        """Hand everything published this tick, as one chunk, to every connection."""
        self._scheduled = False
        pending, self._pending = self._pending, []
        if not pending or not self._connections:
            return
        self.fan_outs += 1
        data = pending[0] if len(pending) == 1 else b"".join(pending)
        framed: list[bytes] = []

        def chunk() -> bytes:  # framed once, for every chunked connection
            if not framed:
                framed.append(_chunk(data))
            return framed[0]

        for connection in list(self._connections):
            if connection.direct(data, chunk):
                continue
            self.queued += 1
            if not connection.offer(data):
                self._drop(
                    connection,
                    "overflow",
                    f"the subscriber fell more than {connection.max_bytes} bytes behind",
                )

    async def stream(self, request: web.Request) -> web.StreamResponse:
        settings = self._settings
        connection = _Connection(settings.queue_bytes)
        if settings.closing.is_set():
            connection.end(_server_frame(DISPOSED, {}), discard=False)
        else:
            self._connections.add(connection)
            if self._unsubscribe is None:
                self._unsubscribe = self._bus.subscribe(self._publish)
        response: web.StreamResponse | None = None
        try:
            response = await open_stream(request)
            sender = Sender(response, request, settings.write_timeout_s)
            connection.sender = sender
            connection.transport = request.transport
            connection.chunked = response.headers.get("Transfer-Encoding") == "chunked"
            if connection.final is not None:
                sender.hurry(settings.close_grace_s)
            try:
                await sender.write(_server_frame("server.connected", {}))
                await self._pump(connection, sender)
            except StalledWriteError as exc:
                await self._stalled(connection, sender, str(exc))
            return response
        except ConnectionResetError:
            if response is None:
                raise
            return response  # the subscriber went away
        finally:
            connection.idle = False  # the handler is done with the transport: no more writes
            connection.transport = None
            self._connections.discard(connection)
            if not self._connections:
                self.close()

    async def _pump(self, connection: _Connection, sender: Sender) -> None:
        heartbeat = self._settings.heartbeat_s
        while True:
            if not connection.frames and connection.final is None:
                if connection.gone:
                    raise ConnectionResetError("the subscriber went away")
                connection.idle = True
                connection.wake.clear()
                try:
                    async with self._settings.clock.timeout(heartbeat):
                        await connection.wake.wait()
                except TimeoutError:
                    connection.idle = False
                    await sender.write(PING)
                    continue
                finally:
                    connection.idle = False
            if connection.frames:
                await sender.write(connection.take())
                continue
            final = connection.final
            if final is not None:
                await sender.write(final)
                return

    async def _stalled(self, connection: _Connection, sender: Sender, why: str) -> None:
        if connection.reason is None and connection.final is None:
            self._drop(connection, "stalled", f"a write made {why}")
        final = connection.final
        assert final is not None
        if sender.partial:
            # The stalled slice ended inside a frame larger than a slice: end
            # that frame (its data is cut short) so the final one parses.
            final = b"\n\n" + final
        try:
            # Behind whatever the peer has not taken yet; it sees the reason if it reads again.
            await sender.write(final)
        except StalledWriteError:
            sender.abort()

    def __len__(self) -> int:
        return len(self._connections)
