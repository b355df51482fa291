"""The aiohttp application: routes derived from the operation table.

For each :class:`~protocol.operations.Operation` the app registers its method
and path, decodes and validates the inputs (:mod:`server._decode`), calls the
handler and encodes the output by the operation's output kind. Domain errors
become their tagged JSON with the tag's status in one middleware; anything
unexpected becomes a logged ``UnknownError`` 500 with a reference, never a
traceback on the wire.

Before anything else, :mod:`server.guard` refuses requests a web page could
forge (foreign Host, foreign Origin, non-JSON bodies), then auth runs. The
database failing underneath (disk full, I/O error) is a retryable
``StorageUnavailableError`` 503 and one log line, not a 500 per request.

The runtime's lifecycle hangs on the app's ``cleanup_ctx`` when the app owns
it (``make_app(config=...)``); an embedding host may pass a running runtime.
"""

from __future__ import annotations

import contextlib
import logging
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, Final

import attrs
import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from actors.collector import collector_paused
from actors.runtime import Runtime, RuntimeConfig
from protocol import codec, ids
from protocol.errors import (
    DomainError,
    InvalidRequestError,
    MethodNotAllowedError,
    PayloadTooLargeError,
    RequestTimeoutError,
    RouteNotFoundError,
    ServiceUnavailableError,
    StorageUnavailableError,
    UnauthorizedError,
    UnknownError,
)
from protocol.openapi import document
from protocol.operations import OPERATIONS, LogQuery, Operation, by_id
from server import console, sse
from server._decode import decode_body, decode_path, decode_query
from server.auth import authorized
from server.feed import EventFeed
from server.guard import Guard, normalize_origin
from server.handlers import HANDLERS, Call
from server.metrics import CONTENT_TYPE, HealthProbe, Metrics
from storage import StorageBrokenError, StorageError, StoreClosedError

__all__ = ["RUNTIME", "SETTINGS", "ServerSettings", "make_app", "runner_options"]

log = logging.getLogger("sessionrt.server")

DEFAULT_MAX_BODY: Final = 32 * 1024 * 1024


def _password(_: object, attribute: attrs.Attribute[str | None], value: str | None) -> None:
    if value is not None and not value:
        raise ValueError("the password is empty; leave it unset for no password")


def _strings(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _origins(
    _: object, attribute: attrs.Attribute[tuple[str, ...]], value: tuple[str, ...]
) -> None:
    for origin in value:
        normalize_origin(origin)


@attrs.frozen(kw_only=True)
class ServerSettings:
    #: The password every client must send (``Authorization: Bearer``, or Basic
    #: with any user name); None: none. An empty one is refused: a mistake, not "none".
    password: str | None = attrs.field(default=None, validator=_password)
    #: The largest request body accepted (a larger one is a 413).
    max_body_bytes: int = DEFAULT_MAX_BODY
    #: Seconds between keep-alive comments on an idle stream.
    heartbeat_s: float = 15.0
    #: Web origins (``https://app.example``) whose pages may call the API, with CORS.
    cors_origins: tuple[str, ...] = attrs.field(default=(), converter=_strings, validator=_origins)
    #: Host names this server answers to besides localhost, loopback and its own address.
    allowed_hosts: tuple[str, ...] = attrs.field(default=(), converter=_strings)
    #: Bytes an ``/api/event`` subscriber may fall behind before it is dropped.
    event_queue_bytes: int = 8 * 1024 * 1024
    #: Seconds a stream write may make no progress before its reader is dropped.
    stream_write_timeout_s: float = 10.0
    #: Seconds streams (and in-flight requests) get to finish when the server stops.
    shutdown_grace_s: float = 0.5
    #: Seconds a connection has to complete a request's headers, counted from its
    #: opening or its previous response (also the keep-alive idle limit).
    header_timeout_s: float = 15.0
    #: Seconds a request's body may take to arrive in full (then 408, connection closed).
    body_timeout_s: float = 30.0


RUNTIME: Final = web.AppKey("runtime", Runtime)
SETTINGS: Final = web.AppKey("settings", ServerSettings)
STREAMS: Final = web.AppKey("streams", sse.StreamSettings)
FEED: Final = web.AppKey("feed", EventFeed)
METRICS: Final = web.AppKey("metrics", Metrics)
HEALTH: Final = web.AppKey("health", HealthProbe)

Endpoint = Callable[[web.Request], Awaitable[web.StreamResponse]]


#: A body longer than this is written in pieces of this size (:class:`_Sent`).
_WRITE_PIECE: Final = 1024 * 1024


class _Sent(web.Response):
    """A response that lets go of its body once the body is written.

    aiohttp's connection loop keeps the last response of a keep-alive
    connection referenced until the next request arrives: a transcript of
    150 MB read once stayed resident for as long as its client stayed idle.

    A long body goes out in pieces, each awaited until the socket has taken
    it: written whole, what the socket could not take at once was copied
    into the transport's buffer (asyncio's selector transport extends a
    bytearray), a second copy of a 150 MB transcript for as long as the
    client took to read it.
    """

    async def write_eof(self, data: bytes = b"") -> None:
        try:
            body = self.body
            if (
                isinstance(body, bytes)
                and len(body) > _WRITE_PIECE
                and not self._compressed_body
                and not self._must_be_empty_body
                and not self._eof_sent
            ):
                view = memoryview(body)
                for start in range(0, len(body), _WRITE_PIECE):
                    await self.write(view[start : start + _WRITE_PIECE])
                await web.StreamResponse.write_eof(self)
            else:
                await super().write_eof(data)
        finally:
            self.body = None


def _json(status: int, body: Any) -> web.Response:
    """``body`` is JSON-ready data (already through the codec)."""
    return _Sent(status=status, body=orjson.dumps(body), content_type="application/json")


def _error(err: DomainError) -> web.Response:
    response = _json(err.status, err.to_wire())
    if isinstance(err, UnauthorizedError):
        response.headers["WWW-Authenticate"] = 'Basic realm="sessionrt"'
    if isinstance(err, StorageUnavailableError):
        response.headers["Retry-After"] = "5"
    elif isinstance(err, ServiceUnavailableError) and err.fields.get("service") == "execution":
        # Another host did not answer (or this one is closing): worth a retry soon.
        response.headers["Retry-After"] = "1"
    if isinstance(err, RequestTimeoutError):
        response.force_close()  # the rest of the body may still come: it is no request
    return response


class _StorageAlarm:
    """One log line when the database starts failing, one when writes work again.

    A full disk fails every write until someone frees space; a line (or a
    traceback) per request would bury the one that matters.
    """

    def __init__(self) -> None:
        self.failing = False

    def failed(self, request: web.Request, exc: StorageBrokenError) -> None:
        if not self.failing:
            self.failing = True
            log.error("storage unavailable (%s %s): %s", request.method, request.path, exc)

    def wrote(self, request: web.Request, response: web.StreamResponse) -> None:
        if self.failing and request.method != "GET" and response.status < 300:
            self.failing = False
            log.warning("storage available again")


ALARM: Final = web.AppKey("storage_alarm", _StorageAlarm)


#: Sec-Fetch-Mode of a page script's fetch (not a navigation).
_SCRIPT_FETCH: Final = frozenset({"cors", "same-origin", "no-cors"})


def _unauthorized(request: web.Request, err: UnauthorizedError) -> web.Response:
    """The 401; a page script's fetch gets a Bearer challenge.

    A Basic challenge makes the browser hold the request and ask with its own
    dialog (headless, it waits forever); the console asks itself and retries.
    """
    response = _error(err)
    if request.headers.get("Sec-Fetch-Mode", "").lower() in _SCRIPT_FETCH:
        response.headers["WWW-Authenticate"] = 'Bearer realm="sessionrt"'
    return response


@web.middleware
async def _errors(request: web.Request, handler: Endpoint) -> web.StreamResponse:
    try:
        response = await handler(request)
    except UnauthorizedError as err:
        return _unauthorized(request, err)
    except DomainError as err:
        return _error(err)
    except web.HTTPRequestEntityTooLarge:
        return _error(PayloadTooLargeError(request.app[SETTINGS].max_body_bytes))
    except HttpProcessingError as exc:  # a malformed body: bad chunk, short content
        return _error(InvalidRequestError(f"Malformed request: {exc.message}", kind="http"))
    except StorageBrokenError as exc:
        # The environment broke (disk full, I/O error); nothing was stored, the
        # same request may work later.
        request.app[ALARM].failed(request, exc)
        return _error(StorageUnavailableError(f"Storage unavailable: {exc}"))
    except StoreClosedError:
        return _error(ServiceUnavailableError("the server is shutting down", service="storage"))
    except web.HTTPNotFound:
        return _error(RouteNotFoundError(f"No route for {request.method} {request.path}"))
    except web.HTTPMethodNotAllowed as exc:
        response = _error(
            MethodNotAllowedError(f"{request.method} is not allowed on {request.path}")
        )
        # A literal path's own methods, not those of the {sessionID} route it also matches.
        allowed = _LITERAL.get(request.path, exc.allowed_methods)
        response.headers["Allow"] = ", ".join(sorted(allowed))
        return response
    except web.HTTPException:
        raise
    except ConnectionResetError:
        raise
    except Exception:
        ref = ids.event_id()
        log.exception("unhandled error (ref %s) on %s %s", ref, request.method, request.path)
        return _error(UnknownError("Internal error", ref=ref))
    request.app[ALARM].wrote(request, response)
    return response


@web.middleware
async def _auth(request: web.Request, handler: Endpoint) -> web.StreamResponse:
    password = request.app[SETTINGS].password
    public = request.match_info.route.name in console.PUBLIC_ROUTES
    if password and not public and not authorized(request.headers.get("Authorization"), password):
        raise UnauthorizedError()
    return await handler(request)


def _directory(request: web.Request) -> str | None:
    """The request's Location: ``directory`` / ``location[directory]`` or the header."""
    value = request.query.get("directory") or request.query.get("location[directory]")
    if value is None:
        header = request.headers.get("x-opencode-directory")
        if header is not None:
            value = _unquote_header(header)
    return value or None


def _unquote_header(header: str) -> str:
    # The header is URL-encoded UTF-8; raw bytes outside ASCII arrive as
    # surrogates and would fail far away, so they fail here as a 400.
    try:
        return urllib.parse.unquote(header.encode("ascii").decode(), errors="strict")
    except UnicodeError:
        raise InvalidRequestError(
            "x-opencode-directory must be URL-encoded UTF-8", field="x-opencode-directory"
        ) from None


#: Paths without parameters and their methods: ``/api/session/active`` is also
#: ``/api/session/{sessionID}`` for PATCH and DELETE, where it must be a 405.
_LITERAL: Final[dict[str, frozenset[str]]] = {
    path: frozenset(
        m
        for op in OPERATIONS
        if op.path == path
        for m in (op.method, "HEAD")[: 2 if op.method == "GET" else 1]
    )
    for path in {op.path for op in OPERATIONS if "{" not in op.path}
}


def _endpoint(op: Operation) -> Endpoint:
    respond = _RESPONDERS.get(op.id)
    if op.streaming and respond is None:
        raise RuntimeError(f"{op.id} streams (output_kind 'sse') but has no responder")

    async def endpoint(request: web.Request) -> web.StreamResponse:
        allowed = _LITERAL.get(request.path)
        if allowed is not None and op.path != request.path:
            raise web.HTTPMethodNotAllowed(request.method, allowed)
        runtime = request.app[RUNTIME]
        path = decode_path(op, request)
        query = decode_query(op, request)
        if op.streaming and request.method == "HEAD":
            return await _head_stream(runtime, path.get("sessionID"))
        if respond is not None:
            return await respond(request, path, query)
        if op.large_body:
            # Parsed and handled with the cycle collector paused: see actors.collector.
            with collector_paused():
                return await _call(op, request, runtime, path, query)
        return await _call(op, request, runtime, path, query)

    endpoint.__name__ = op.id.replace(".", "_")
    return endpoint


async def _call(
    op: Operation, request: web.Request, runtime: Runtime, path: dict[str, str], query: Any
) -> web.StreamResponse:
    """Decode the body, run the operation's handler, encode its result."""
    settings = request.app[SETTINGS]
    body = await decode_body(
        op, request, settings.body_timeout_s, settings.max_body_bytes, runtime.blocking.run
    )
    call = Call(
        runtime=runtime,
        path=path,
        query=query,
        body=body,
        request=request,
        directory=_directory(request),
    )
    result = await HANDLERS[op.id](call)
    return _encode(op, result)


def _encode(op: Operation, result: Any) -> web.Response:
    if op.output_kind == "no_content":
        return web.Response(status=204)
    if op.output_kind == "data":
        return _json(200, {"data": codec.to_json(result)})
    if op.output_kind == "items":
        return _json(200, {"data": [codec.to_json(r) for r in result]})
    if op.output_kind == "page":
        return _json(
            200, {"data": codec.to_json(result.data), "cursor": codec.to_json(result.cursor)}
        )
    return _json(200, codec.to_json(result))


#: What answers an operation that writes its own response: (request, path
#: parameters, query) -> response.
Responder = Callable[[web.Request, dict[str, str], Any], Awaitable[web.StreamResponse]]


async def _session_log(
    request: web.Request, path: dict[str, str], query: Any
) -> web.StreamResponse:
    app = request.app
    return await sse.session_log(app[RUNTIME], app[STREAMS], request, path["sessionID"], query)


async def _event_subscribe(
    request: web.Request, path: dict[str, str], query: Any
) -> web.StreamResponse:
    return await request.app[FEED].stream(request)


async def _head_stream(runtime: Runtime, session_id: str | None) -> web.Response:
    """HEAD on a stream: the status and headers its GET would start with, and no stream."""
    if session_id is not None:
        await runtime.sessions.get(session_id)
    return web.Response(status=200, headers={"Content-Type": "text/event-stream"})


async def _doc(request: web.Request) -> web.Response:
    return _json(200, document())


async def _metrics(request: web.Request) -> web.Response:
    """The Prometheus text format; behind the password like every route."""
    app = request.app
    active = len(await app[RUNTIME].execution.active())
    body = app[METRICS].render(active=active, feed=len(app[FEED]), logs=app[STREAMS].open_logs)
    response = _Sent(status=200, body=body)
    response.headers["Content-Type"] = CONTENT_TYPE
    return response


async def _health(request: web.Request) -> web.Response:
    """200 when the store takes writes; a tagged 503 (retryable) when it does not."""
    runtime = request.app[RUNTIME]
    if runtime.config.read_only or not runtime.store.is_open:
        raise ServiceUnavailableError("the store is not open for writing", service="storage")
    if request.app[ALARM].failing:
        raise StorageUnavailableError("Storage unavailable: the last write failed")
    try:
        await request.app[HEALTH].check()
    except StorageError as exc:
        raise StorageUnavailableError(f"Storage unavailable: {exc}") from None
    return _json(200, {"healthy": True})


#: The operations that write their own response instead of returning a value
#: for :data:`~server.handlers.HANDLERS`: every streaming one (``output_kind``
#: "sse" on the operation table: a route for one without a responder is not
#: built) and the two probes.
_RESPONDERS: Final[dict[str, Responder]] = {
    "session.log": _session_log,
    "event.subscribe": _event_subscribe,
    "server.metrics": lambda request, path, query: _metrics(request),
    "server.health": lambda request, path, query: _health(request),
}


async def _compat_event_log(request: web.Request) -> web.StreamResponse:
    """The released v2 client's ``GET /api/session/{id}/event?after=``: the log, followed."""
    op = by_id("session.log")
    path = decode_path(op, request)
    query = decode_query(op, request)
    if request.method == "HEAD":
        return await _head_stream(request.app[RUNTIME], path["sessionID"])
    return await sse.session_log(
        request.app[RUNTIME],
        request.app[STREAMS],
        request,
        path["sessionID"],
        attrs.evolve(query or LogQuery(), follow=True),
    )


async def _compat_feed(request: web.Request) -> web.StreamResponse:
    if request.method == "HEAD":
        return await _head_stream(request.app[RUNTIME], None)
    return await request.app[FEED].stream(request)


def runner_options(settings: ServerSettings) -> dict[str, Any]:
    """``web.AppRunner`` arguments every host of the app uses (serve, embedded, tests).

    aiohttp's keep-alive timer runs from a connection's opening and from each
    response until the next request's headers are complete, so it is also the
    header timeout: a client that never finishes its headers is closed then.
    """
    return {
        "handler_cancellation": True,
        "access_log": None,
        "keepalive_timeout": settings.header_timeout_s,
        "shutdown_timeout": 2 * settings.shutdown_grace_s,
    }


def make_app(
    *,
    runtime: Runtime | None = None,
    config: RuntimeConfig | None = None,
    settings: ServerSettings | None = None,
) -> web.Application:
    """The app over a given running ``runtime``, or one it opens from ``config``."""
    if (runtime is None) == (config is None):
        raise ValueError("pass exactly one of runtime or config")
    settings = settings or ServerSettings()
    guard = Guard(cors_origins=settings.cors_origins, allowed_hosts=settings.allowed_hosts)
    app = web.Application(
        middlewares=[_errors, guard.middleware, _auth], client_max_size=settings.max_body_bytes
    )
    app.on_response_prepare.append(guard.on_prepare)
    app[SETTINGS] = settings
    app[ALARM] = _StorageAlarm()
    app[STREAMS] = sse.StreamSettings(
        heartbeat_s=settings.heartbeat_s,
        queue_bytes=settings.event_queue_bytes,
        write_timeout_s=settings.stream_write_timeout_s,
        close_grace_s=settings.shutdown_grace_s,
        clock=_runtime_config(runtime, config).clock,
    )
    for op in _registration_order(OPERATIONS):
        if op.method == "GET":
            app.router.add_get(op.path, _endpoint(op), name=op.id)  # and HEAD
        else:
            app.router.add_route(op.method, op.path, _endpoint(op), name=op.id)
    app.router.add_get("/doc", _doc, name="openapi")
    console.add_routes(app)
    app.router.add_get("/api/session/{sessionID}/event", _compat_event_log, name="compat.log")
    app.router.add_get("/event", _compat_feed, name="compat.event")

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        if config is not None:
            async with Runtime(config) as owned:
                app[RUNTIME] = owned
                async for _ in _feed(app, owned):
                    yield
        else:
            assert runtime is not None
            app[RUNTIME] = runtime
            async for _ in _feed(app, runtime):
                yield

    app.cleanup_ctx.append(lifecycle)

    async def on_shutdown(app: web.Application) -> None:
        if FEED in app:
            app[FEED].dispose()
        app[STREAMS].close()

    app.on_shutdown.append(on_shutdown)
    return app


#: Operations whose routes are registered (and so tried) first: the admission.
_FIRST: Final = ("session.prompt",)


def _registration_order(operations: Iterable[Operation]) -> list[Operation]:
    """The operations in the order their routes are registered: :data:`_FIRST`, then the table's.

    aiohttp's router tries the resources under a path's literal prefix in
    registration order, one regex each: ``/api/session/{id}/prompt`` shares the
    prefix ``/api/session`` with 30-odd routes and came tenth (16 µs of an
    admission's ~180 µs of loop CPU; first, 3 µs). The paths under one prefix
    do not overlap (each has its own literal segments; the same path with
    another method only adds to a 405's Allow), so the order changes nothing
    but the time to find a route.
    """
    return sorted(operations, key=lambda op: op.id not in _FIRST)  # stable: the table's order


def _runtime_config(runtime: Runtime | None, config: RuntimeConfig | None) -> RuntimeConfig:
    if config is not None:
        return config
    assert runtime is not None
    return runtime.config


async def _feed(app: web.Application, runtime: Runtime) -> AsyncIterator[None]:
    feed = EventFeed(runtime.bus, app[STREAMS])
    app[FEED] = feed
    metrics = Metrics()
    app[METRICS] = metrics
    unsubscribe = runtime.store.subscribe(metrics.committed)
    runtime.store.batch_observers.append(metrics.batch)
    health = HealthProbe(runtime.store, runtime.blocking.run)
    app[HEALTH] = health
    try:
        yield
    finally:
        await health.aclose()
        unsubscribe()
        with contextlib.suppress(ValueError):
            runtime.store.batch_observers.remove(metrics.batch)
        feed.close()
