"""The web console: a page served at ``/`` from files inside this package.

Nothing is fetched from elsewhere at run time (no CDN, no build step): the
page is plain HTML, CSS and JavaScript, read once from the package when the
app is made. The files carry no data, so they are served without the
password; the page asks for it and sends it (``Authorization: Bearer``) with
every API call, the streams included, which it reads with ``fetch`` (an
``EventSource`` cannot send headers, and a password in a URL would end up in
logs and history). Its requests are same-origin, so they pass the Host and
Origin checks of :mod:`server.guard` like any other.

The answers forbid framing and any script, style or connection from another
origin (Content-Security-Policy), so the page cannot be turned against the
API it drives.
"""

from __future__ import annotations

import importlib.resources
from typing import Final

from aiohttp import web

__all__ = ["ASSETS", "PUBLIC_ROUTES", "add_routes"]

_TYPES: Final = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}
#: The files the console is made of; nothing else is served from here.
ASSETS: Final = ("index.html", "console.js", "console-feed.js", "console.css")
#: Route names the password does not cover (the page must load to ask for it).
PUBLIC_ROUTES: Final = frozenset({"console.index", "console.asset"})
_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; worker-src 'self'; style-src 'self';"
        " connect-src 'self';"
        " img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _load() -> dict[str, bytes]:
    root = importlib.resources.files(__package__)
    return {name: root.joinpath(name).read_bytes() for name in ASSETS}


def add_routes(app: web.Application) -> None:
    """``GET /`` (the page) and ``GET /console/{name}`` (its script and style)."""
    files = _load()

    def answer(name: str) -> web.Response:
        suffix = name[name.rfind(".") :]
        response = web.Response(body=files[name], headers=_HEADERS)
        response.headers["Content-Type"] = _TYPES[suffix]
        return response

    async def index(request: web.Request) -> web.Response:
        return answer("index.html")

    async def asset(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in files or name == "index.html":
            raise web.HTTPNotFound()
        return answer(name)

    app.router.add_get("/", index, name="console.index")
    app.router.add_get("/console/{name}", asset, name="console.asset")
