"""An in-process HTTP transport: the real aiohttp stack, no listening socket.

Each connection the client opens is one ``socket.socketpair()``: one end is
handed to the app's aiohttp server as an accepted connection, the other to
the client's protocol. Requests therefore go through the same HTTP parser,
routing, middleware, codecs and errors as over TCP, but nothing listens and
nothing is reachable from outside the process.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

__all__ = ["InProcessConnector"]

if TYPE_CHECKING:
    from aiohttp.client_proto import ResponseHandler


class InProcessConnector(aiohttp.BaseConnector):
    def __init__(self, server: web.Server, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._server = server

    async def _create_connection(
        self,
        req: Any,
        traces: Any,
        timeout: aiohttp.ClientTimeout,  # noqa: ASYNC109 - aiohttp's signature
    ) -> ResponseHandler:
        client_end, server_end = socket.socketpair()
        try:
            client_end.setblocking(False)
            server_end.setblocking(False)
            await self._loop.connect_accepted_socket(self._server, sock=server_end)
        except BaseException:
            client_end.close()
            server_end.close()
            raise
        try:
            _, protocol = await self._loop.create_connection(self._factory, sock=client_end)
        except BaseException:
            client_end.close()
            raise
        return protocol
