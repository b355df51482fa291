"""A minimal aiohttp app that answers the client with canned wire-format replies.

Routes are registered per test by method and raw path; every request is
recorded. Handlers that never answer report when the client went away
(the test server runs with ``handler_cancellation=True``, so a client
disconnect cancels the handler).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal

import attrs
import orjson
from aiohttp import web
from multidict import CIMultiDictProxy

Then = Literal["end", "hang", "abort"]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

SESSION: dict[str, Any] = {
    "id": "ses_1",
    "title": "first",
    "location": {"directory": "/work"},
    "time": {"created": 1764460000000, "updated": 1764460000001},
    "tokens": {"input": 3, "output": 4, "reasoning": 0, "cache": {"read": 1, "write": 0}},
    "cost": 0.5,
}

INBOX_ITEM: dict[str, Any] = {
    "id": "msg_1",
    "sessionID": "ses_1",
    "type": "user",
    "delivery": "steer",
    "timeCreated": 1764460000002,
    "payload": {"text": "hello"},
}


def session(**changes: Any) -> dict[str, Any]:
    return {**SESSION, **changes}


@attrs.frozen(kw_only=True)
class Seen:
    """One request as the server received it."""

    method: str
    path: str
    query: tuple[tuple[str, str], ...]
    headers: CIMultiDictProxy[str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


class FakeServer:
    def __init__(self) -> None:
        self.url = ""
        self.routes: dict[tuple[str, str], Handler] = {}
        self.requests: list[Seen] = []
        #: Set when a hanging handler got its request / saw the client go away.
        self.arrived = asyncio.Event()
        self.disconnected = asyncio.Event()
        self.app = web.Application()
        self.app.router.add_route("*", "/{tail:.*}", self._dispatch)

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests.append(
            Seen(
                method=request.method,
                path=request.rel_url.raw_path,
                query=tuple(request.rel_url.query.items()),
                headers=request.headers,
                body=body,
            )
        )
        handler = self.routes.get((request.method, request.rel_url.raw_path))
        if handler is None:
            return web.Response(status=599, text=f"no route {request.method} {request.path}")
        return await handler(request)

    @property
    def last(self) -> Seen:
        return self.requests[-1]

    def on(self, method: str, path: str, handler: Handler) -> None:
        self.routes[(method, path)] = handler

    def json(self, method: str, path: str, body: Any, *, status: int = 200) -> None:
        async def reply(request: web.Request) -> web.StreamResponse:
            return web.Response(
                status=status, body=orjson.dumps(body), content_type="application/json"
            )

        self.on(method, path, reply)

    def json_sequence(self, method: str, path: str, bodies: Sequence[Any]) -> None:
        """Answer successive requests with successive bodies."""
        replies = iter(bodies)

        async def reply(request: web.Request) -> web.StreamResponse:
            return web.Response(body=orjson.dumps(next(replies)), content_type="application/json")

        self.on(method, path, reply)

    def raw(
        self, method: str, path: str, body: bytes, *, status: int = 200, content_type: str
    ) -> None:
        async def reply(request: web.Request) -> web.StreamResponse:
            return web.Response(status=status, body=body, content_type=content_type)

        self.on(method, path, reply)

    def no_content(self, method: str, path: str) -> None:
        async def reply(request: web.Request) -> web.StreamResponse:
            return web.Response(status=204)

        self.on(method, path, reply)

    def hang(self, method: str, path: str) -> None:
        """Never answer; record the arrival and the client's disconnect."""

        async def reply(request: web.Request) -> web.StreamResponse:
            self.arrived.set()
            await self._until_disconnected()
            raise AssertionError("unreachable")

        self.on(method, path, reply)

    def sse(self, method: str, path: str, chunks: Sequence[bytes], *, then: Then = "end") -> None:
        """Stream ``chunks``, then ``end`` cleanly, ``hang`` forever, or ``abort`` the socket."""
        self.sse_sequence(method, path, [(chunks, then)] * 1000)

    def sse_sequence(
        self, method: str, path: str, connections: Sequence[tuple[Sequence[bytes], Then]]
    ) -> None:
        """Like :meth:`sse`, one script per successive connection."""
        scripts = iter(connections)

        async def reply(request: web.Request) -> web.StreamResponse:
            chunks, then = next(scripts)
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for chunk in chunks:
                await response.write(chunk)
            if then == "hang":
                self.arrived.set()
                await self._until_disconnected()
            if then == "abort":
                assert request.transport is not None
                request.transport.abort()
                return response
            await response.write_eof()
            return response

        self.on(method, path, reply)

    async def _until_disconnected(self) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.disconnected.set()
            raise
