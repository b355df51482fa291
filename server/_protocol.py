"""aiohttp's own refusals as tagged JSON: the runner every sessionrt server uses.

aiohttp answers a request it cannot parse (a bad method, a line over its limit,
a malformed header) itself, before any middleware runs, with ``text/plain``
and a logged traceback. :func:`make_runner` builds an :class:`~aiohttp.web.AppRunner`
whose connections answer those with the project's error shape instead
(``InvalidRequestError``, kind ``http``, with aiohttp's status) and log one
line. It is used by ``serve``, the embedded host and the tests' server alike.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from protocol.errors import (
    DomainError,
    InvalidRequestError,
    ServiceUnavailableError,
    UnknownError,
)

__all__ = ["TaggedRunner", "make_runner"]

log = logging.getLogger("sessionrt.server")


def _tagged(status: int, message: str) -> DomainError:
    if 400 <= status < 500:
        return InvalidRequestError(message, kind="http")
    if status in (503, 504):  # 504: aiohttp's handler timeout
        return ServiceUnavailableError(message)
    return UnknownError("Internal error")


class _TaggedRequestHandler(RequestHandler):
    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:
            raise ConnectionError("the response has begun; no error answer can follow")
        text = message or (str(exc) if exc is not None else "") or "Bad request"
        # One line, no traceback: a client sending garbage is not our fault.
        log.info("refused an unparsable request from %s: %s %s", request.remote, status, text)
        err = _tagged(status, text.splitlines()[0][:200])
        response = web.Response(
            status=err.status,
            body=orjson.dumps(err.to_wire()),
            content_type="application/json",
        )
        response.force_close()
        return response


class _TaggedServer(web.Server):
    def __call__(self) -> RequestHandler:
        return _TaggedRequestHandler(self, loop=self._loop, **self._kwargs)


class TaggedRunner(web.AppRunner):
    """An :class:`~aiohttp.web.AppRunner` whose connections answer parse errors in JSON."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # aiohttp has no hook for the protocol class: give this one server
        # instance a subclass that only changes which handler it creates.
        server.__class__ = _TaggedServer
        return server


def make_runner(app: web.Application, **kwargs: Any) -> web.AppRunner:
    """The runner for ``app``, with ``handler_cancellation`` and no access log by default."""
    kwargs.setdefault("handler_cancellation", True)
    kwargs.setdefault("access_log", None)
    return TaggedRunner(app, **kwargs)
