"""A streaming operation's result: a cold, single-use async iterator of SSE frames.

Nothing happens when the stream is made; the first ``__anext__`` opens the
connection, so connection failures, declared errors (``SessionNotFoundError``)
and infrastructure failures (:class:`~protocol.client.ClientError`) surface
from iteration. The response is closed when the stream ends, fails, is
closed (:meth:`EventStream.aclose`, ``async with``, or the client closing) or
the iterating task is cancelled. It never reconnects: a lost connection ends
iteration with ``ClientError(reason="transport")``; resuming is the caller's
decision (see :func:`protocol.client.follow_log`).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from typing import Final, Literal

import aiohttp

from protocol._client_http import (
    CallOptions,
    ClientError,
    Connection,
    read_failure,
    transport_error,
)
from protocol.lifecycle import LifecycleState
from protocol.operations import Operation
from protocol.sse import (
    RawFrame,
    SSEDecodeError,
    SSEDecoder,
    SSEEvent,
    SSELineTooLongError,
    parse_raw,
)

__all__ = ["EventStream"]

_EVENT_STREAM: Final = "text/event-stream"

_State = Literal["new", "open", "done"]


class EventStream(AsyncIterator[SSEEvent]):
    """Server-sent events of one streaming operation, opened on first iteration.

    Iterate it once (``async for``); use ``async with`` or :meth:`aclose` to
    close it early. :attr:`last_event_id` is the last ``id:`` the server sent.
    """

    def __init__(
        self,
        connection: Connection,
        op: Operation,
        *,
        path_params: Mapping[str, str] | None = None,
        query: object = None,
        headers: Mapping[str, str] | None = None,
        options: CallOptions | None = None,
    ) -> None:
        self._connection = connection
        self._op = op
        self._path_params = dict(path_params or {})
        self._query = query
        self._headers = dict(headers or {})
        self._options = options
        self._state: _State = "new"
        self._response: aiohttp.ClientResponse | None = None
        self._decoder = SSEDecoder()
        self._ready: collections.deque[RawFrame] = collections.deque()
        self._cut_by_client = False

    @property
    def last_event_id(self) -> str | None:
        return self._decoder.last_event_id

    @property
    def closed(self) -> bool:
        return self._state == "done"

    def __aiter__(self) -> EventStream:
        return self

    async def __aenter__(self) -> EventStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop the stream and close its connection; idempotent."""
        if self._state != "done" and self._connection.state is LifecycleState.CLOSED:
            # The client is closing its streams: iteration reports that, not a quiet end.
            self._cut_by_client = True
        self._ready.clear()
        self._finish(reuse=False)

    async def __anext__(self) -> SSEEvent:
        if self._ready:
            return self._deliver()
        if self._state == "done":
            if self._cut_by_client:
                raise self._client_closed()
            raise StopAsyncIteration
        try:
            if self._state == "new":
                await self._open()
            await self._fill()
        except BaseException as exc:
            # Whatever happened, cancellation included, the response must not outlive it.
            # A property, not self._state: the state changes under us while we await.
            interrupted = self.closed
            self._finish(reuse=False)
            translated = self._translate(exc, interrupted=interrupted)
            if translated is exc:
                raise
            raise translated from exc
        if self._ready:
            return self._deliver()
        raise StopAsyncIteration

    def _deliver(self) -> SSEEvent:
        try:
            return parse_raw(self._ready.popleft())
        except SSEDecodeError as exc:
            self._ready.clear()
            self._finish(reuse=False)
            op = self._op
            raise ClientError(
                "malformed_response", f"{op.id}: {exc}", status=200, operation=op.id
            ) from None

    def _translate(self, exc: BaseException, *, interrupted: bool) -> BaseException:
        op = self._op
        if interrupted and isinstance(exc, aiohttp.ClientError | ClientError):
            # aclose() or the client's close cut the connection under a waiting reader.
            return self._client_closed() if self._cut_by_client else StopAsyncIteration()
        if isinstance(exc, aiohttp.ClientError):
            return transport_error(op, exc)
        if isinstance(exc, SSELineTooLongError):
            return ClientError("malformed_response", f"{op.id}: {exc}", status=200, operation=op.id)
        return exc

    async def _open(self) -> None:
        self._state = "open"
        connection, op = self._connection, self._op
        # Registered before connecting, so closing the client stops a stream still connecting.
        connection.streams.add(self)
        try:
            async with asyncio.timeout(connection.deadline(self._options)):
                response = await connection.send(
                    op,
                    path_params=self._path_params,
                    query=self._query,
                    body=None,
                    options=self._options,
                    accept=_EVENT_STREAM,
                    headers=self._headers,
                )
                if self.closed:
                    response.close()
                    return
                self._response = response
                if not 200 <= response.status < 300:
                    raise await read_failure(op, response)
        except TimeoutError as exc:
            raise transport_error(op, exc) from None
        if response.content_type != _EVENT_STREAM:
            raise ClientError(
                "unsupported_content_type",
                f"{op.id}: expected {_EVENT_STREAM}, got {response.content_type!r}",
                status=response.status,
                operation=op.id,
            )

    async def _fill(self) -> None:
        """Read until at least one frame is ready or the stream ends."""
        response = self._response
        while not self._ready and response is not None and self._state == "open":
            chunk = await response.content.readany()
            if not chunk:
                self._ready.extend(self._decoder.end_raw())
                self._finish(reuse=True)
                return
            self._ready.extend(self._decoder.feed_raw(chunk))

    def _finish(self, *, reuse: bool) -> None:
        self._state = "done"
        self._connection.streams.discard(self)
        response, self._response = self._response, None
        if response is not None:
            if reuse:
                response.release()
            else:
                response.close()

    def _client_closed(self) -> ClientError:
        op = self._op
        return ClientError("closed", f"{op.id}: the client was closed", operation=op.id)
