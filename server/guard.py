"""Who may drive the server: the Host, Origin and body-type checks, and CORS.

A browser lets any web page send a request to ``http://127.0.0.1:4096``; it only
keeps the page from reading the answer. Three checks, run on every request
before authentication, keep a page from *driving* the server:

- **Host.** The ``Host`` header must name this server: ``localhost``, a loopback
  address, the address the connection arrived on, or a name the operator
  configured (``[server] allowed_hosts``; the name given to ``--host`` counts).
  A DNS-rebinding page reaches us under its own name, so it is refused (421)
  and can read nothing. Connections that are not TCP (the embedded host's
  socketpair) carry no browser and are not checked.
- **Origin.** A request with an ``Origin`` is refused (403) unless it comes from
  the server's own origin on loopback (the Host it was sent to, or a loopback
  name on the port it arrived on) or from one of ``--cors-origin`` /
  ``[server] cors_origins``. Without ``Origin``, ``Sec-Fetch-Site: cross-site``
  (or ``same-site``: another port of the same host) is refused too. Clients
  that are not browsers send neither header and pass.
- **Body type.** A state-changing request that carries a body must say
  ``Content-Type: application/json`` (415). ``text/plain``, forms and
  multipart are exactly what a page may send cross-site without a preflight;
  a POST with no body (interrupt, resume) needs no type.

CORS preflights (``OPTIONS`` with ``Access-Control-Request-Method``) are answered
for allowed origins only, and every answer to an allowed cross-origin request
carries ``Access-Control-Allow-Origin`` for exactly that origin.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Iterable
from typing import Final
from urllib.parse import urlsplit

from aiohttp import web

from protocol.errors import ForbiddenError, MisdirectedRequestError, UnsupportedMediaTypeError

__all__ = ["Guard", "normalize_origin"]

Endpoint = Callable[[web.Request], Awaitable[web.StreamResponse]]

_STATE_CHANGING: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_METHODS: Final = "GET, HEAD, POST, PUT, PATCH, DELETE"
_HEADERS: Final = "Authorization, Content-Type, Last-Event-ID, x-opencode-directory"
_REFUSED_SITES: Final = frozenset({"cross-site", "same-site"})
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}


def normalize_origin(value: str) -> str:
    """``scheme://host[:port]`` in lower case without a default port; ValueError if not one."""
    parsed = urlsplit(value.strip())
    if (
        parsed.scheme not in _DEFAULT_PORTS
        or not parsed.hostname
        or parsed.path not in ("", "/")
        or parsed.query
        or parsed.fragment
        or parsed.username is not None
        or parsed.password is not None
    ):
        raise ValueError(f"expected an origin like http://host:port, got {value!r}")
    return _origin(parsed.scheme, parsed.hostname, parsed.port)


def _origin(scheme: str, host: str, port: int | None) -> str:
    shown = f"[{host}]" if ":" in host else host
    if port is None or port == _DEFAULT_PORTS[scheme]:
        return f"{scheme}://{shown}"
    return f"{scheme}://{shown}:{port}"


def _split_host(value: str) -> tuple[str, int | None] | None:
    """``Host`` header -> (lower-case name without brackets or final dot, port)."""
    try:
        parsed = urlsplit("//" + value.strip())
        name, port = parsed.hostname, parsed.port
    except ValueError:
        return None
    if not name or parsed.path or parsed.query or parsed.fragment or parsed.username:
        return None
    return name.rstrip("."), port


def _ip(value: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(value.split("%", 1)[0])
    except ValueError:
        return None


#: Host verdicts a :class:`Guard` keeps (a handful in practice: one per name it is reached by).
_HOST_VERDICTS: Final = 256


class Guard:
    """The checks above for one server; ``middleware`` runs them, ``on_prepare`` adds CORS."""

    def __init__(self, *, cors_origins: Iterable[str] = (), allowed_hosts: Iterable[str] = ()):
        self._origins = frozenset(normalize_origin(o) for o in cors_origins)
        hosts = {h.strip().lower().rstrip(".") for h in allowed_hosts}
        self._any_host = "*" in hosts
        self._hosts = frozenset(hosts - {"*"})
        #: ``_check_host``'s verdicts by (Host header, local address): a client
        #: sends the same Host on every request, and parsing it (urlsplit,
        #: ipaddress) was a tenth of an admission's CPU. Bounded: cleared when full.
        self._host_verdicts: dict[tuple[str, str], bool] = {}

    # -- checks -------------------------------------------------------------------------------

    def _local(self, request: web.Request) -> tuple[str, int] | None:
        """(address, port) the TCP connection arrived on; None for other transports."""
        transport = request.transport
        name = transport.get_extra_info("sockname") if transport is not None else None
        # An IPv4 socket's name is (host, port), an IPv6 one's (host, port, flow,
        # scope); a Unix socket's is a str or bytes. (Asking the socket for its
        # family builds an enum member at every request.)
        if not isinstance(name, tuple) or len(name) not in (2, 4):
            return None
        return str(name[0]), int(name[1])

    def _is_ours(self, name: str, local: tuple[str, int] | None) -> bool:
        if name == "localhost" or name in self._hosts:
            return True
        ip = _ip(name)
        if ip is None:
            return False
        if ip.is_loopback:
            return True
        return local is not None and ip == _ip(local[0])

    def _check_host(self, request: web.Request, local: tuple[str, int] | None) -> None:
        if local is None or self._any_host:
            return
        value = request.headers.get("Host")
        if value is None:
            return  # HTTP/1.0 without Host: no browser sends that
        key = (value, local[0])
        ours = self._host_verdicts.get(key)
        if ours is None:
            split = _split_host(value)
            ours = split is not None and self._is_ours(split[0], local)
            if len(self._host_verdicts) >= _HOST_VERDICTS:
                self._host_verdicts.clear()
            self._host_verdicts[key] = ours
        if not ours:
            raise MisdirectedRequestError(
                "This server does not answer to that Host; add it to [server] allowed_hosts"
            )

    def _allowed_origin(
        self, origin: str, request: web.Request, local: tuple[str, int] | None
    ) -> str | None:
        try:
            normalized = normalize_origin(origin)
        except ValueError:
            return None  # "null", garbage: never one of ours
        if normalized in self._origins:
            return normalized
        if local is None:
            return None
        parsed = urlsplit(normalized)
        if parsed.scheme != "http" or parsed.hostname is None:
            return None
        host = request.headers.get("Host")
        split = _split_host(host) if host is not None else None
        port = parsed.port or 80
        # Same origin as the (already checked) Host it was sent to, or one of our
        # loopback names on the port this connection arrived on.
        same_as_host = (
            split is not None
            and (parsed.hostname, port) == (split[0], split[1] or 80)
            and (self._any_host or self._is_ours(split[0], local))
        )
        if same_as_host or (port == local[1] and self._is_ours(parsed.hostname, local)):
            return normalized
        return None

    def _check_origin(self, request: web.Request, local: tuple[str, int] | None) -> str | None:
        origin = request.headers.get("Origin")
        if origin is None:
            site = request.headers.get("Sec-Fetch-Site", "").strip().lower()
            if site in _REFUSED_SITES:
                raise ForbiddenError(f"Refused a {site} request from a web page")
            return None
        allowed = self._allowed_origin(origin, request, local)
        if allowed is None:
            raise ForbiddenError(
                "Refused a request from a web page of another origin;"
                " allow it with --cors-origin or [server] cors_origins"
            )
        return allowed

    @staticmethod
    def _check_body_type(request: web.Request) -> None:
        if (
            request.method in _STATE_CHANGING
            and request.body_exists
            and request.content_type != "application/json"
        ):
            raise UnsupportedMediaTypeError(
                f"A request body must be application/json, not {request.content_type}"
            )

    # -- aiohttp hooks ------------------------------------------------------------------------

    @web.middleware
    async def middleware(self, request: web.Request, handler: Endpoint) -> web.StreamResponse:
        local = self._local(request)
        self._check_host(request, local)
        allowed = self._check_origin(request, local)
        preflight = "Access-Control-Request-Method" in request.headers
        if allowed is not None and request.method == "OPTIONS" and preflight:
            return web.Response(
                status=204,
                headers={
                    "Access-Control-Allow-Methods": _METHODS,
                    "Access-Control-Allow-Headers": _HEADERS,
                    "Access-Control-Max-Age": "600",
                },
            )
        self._check_body_type(request)
        return await handler(request)

    async def on_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        origin = request.headers.get("Origin")
        if origin is None:
            return
        response.headers.add("Vary", "Origin")
        if self._allowed_origin(origin, request, self._local(request)) is not None:
            # The exact string the browser sent: it compares byte for byte.
            response.headers["Access-Control-Allow-Origin"] = request.headers["Origin"]
