"""The web console: a page served at ``/`` from files inside this package.

Nothing is fetched from elsewhere at run time (no CDN, no build step): the
page is plain HTML, CSS and JavaScript, read once from the package when the
app is made. The files carry no data, so they are served without the
password; the page asks for it and sends it (``Authorization: Bearer``) with
every API call, the streams included, which it reads with ``fetch`` (an
``EventSource`` cannot send headers, and a password in a URL would end up in
logs and history). Its requests are same-origin, so they pass the Host and
Origin checks of :mod:`server.guard` like any other.

First paint waits for no file but the page: the style sheet and the page's
script are inlined into ``index.html`` when the app is made (allowed by their
hashes in the Content-Security-Policy, no ``'unsafe-inline'``), the script
with the modules it imports (``console-sse.js``, also imported by the feed
worker, ``console-markdown.js`` and ``console-work.js``) put in place of their
import lines. Every answer carries a
strong ETag (a hash of its bytes: a revalidation costs a 304 and no body) and
is gzipped when the client accepts it; bodies and their gzipped forms are made
once, at start (a fixed set of files, a few tens of KiB in all).

The answers forbid framing and any script, style or connection from another
origin (Content-Security-Policy), so the page cannot be turned against the
API it drives.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.resources
import re
from typing import Final

import attrs
from aiohttp import web

__all__ = ["ASSETS", "PUBLIC_ROUTES", "add_routes"]

_TYPES: Final = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}
#: The files the console is made of; nothing else is served from here.
ASSETS: Final = (
    "index.html",
    "console.js",
    "console-sse.js",
    "console-feed.js",
    "console-markdown.js",
    "console-work.js",
    "console.css",
)
#: Route names the password does not cover (the page must load to ask for it).
PUBLIC_ROUTES: Final = frozenset({"console.index", "console.asset"})
#: In index.html, the tags replaced by the inlined file.
_STYLE_TAG: Final = '<link rel="stylesheet" href="/console/console.css">'
_SCRIPT_TAG: Final = '<script type="module" src="/console/console.js"></script>'
#: In console.js, the imports replaced by their module's text, each in a function
#: of its own (so its private names cannot meet the page's) returning its exports.
_IMPORTS: Final = {
    "console-sse.js": 'import { readFrames } from "/console/console-sse.js";\n',
    "console-markdown.js": 'import { renderMarkdown } from "/console/console-markdown.js";\n',
    "console-work.js": "import { agentOptions, promptBar, renderDiff, revertText, sessionTree,"
    ' stepChanges, wroteFiles } from "/console/console-work.js";\n',
}
_POLICY: Final = (
    "default-src 'none'; script-src 'self'{scripts}; worker-src 'self'; style-src 'self'{styles};"
    " connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none';"
    " frame-ancestors 'none'"
)
_HEADERS: Final = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Revalidate every time (a 304 when unchanged): an upgraded server never
    # pairs a cached old script with a new page.
    "Cache-Control": "no-cache",
}


@attrs.frozen
class _File:
    body: bytes
    gzipped: bytes
    etag: str
    type: str
    policy: str


def _digest(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def _file(name: str, body: bytes, policy: str) -> _File:
    return _File(
        body=body,
        gzipped=gzip.compress(body, compresslevel=9, mtime=0),
        etag='"' + hashlib.sha256(body).hexdigest()[:32] + '"',
        type=_TYPES[name[name.rfind(".") :]],
        policy=policy,
    )


def _module(name: str, line: str, text: str) -> str:
    """An imported module as a statement binding the names ``line`` imports."""
    plain = "\n".join(line.removeprefix("export ") for line in text.split("\n"))
    if re.search(r"^\s*(import|export)\b", plain, re.M):
        raise RuntimeError(f"{name} must stay a module with plain top-level exports")
    names = line[line.index("{") + 1 : line.index("}")].strip()
    return f"const {{ {names} }} = (() => {{\n{plain}\nreturn {{ {names} }};\n}})();\n"


def _inline(html: str, style: str, script: str, modules: dict[str, str]) -> tuple[str, str]:
    """The page with its style and script inlined, and the policy that allows exactly them."""
    lost = [name for name, line in _IMPORTS.items() if line not in script]
    if _STYLE_TAG not in html or _SCRIPT_TAG not in html or lost:
        raise RuntimeError("index.html or console.js lost what the console inlines")
    for name, line in _IMPORTS.items():
        script = script.replace(line, _module(name, line, modules[name]))
    if "</style" in style or "</script" in script:
        raise RuntimeError("an inlined console file closes its own tag")
    html = html.replace(_STYLE_TAG, "<style>" + style + "</style>")
    html = html.replace(_SCRIPT_TAG, '<script type="module">' + script + "</script>")
    policy = _POLICY.format(scripts=" " + _digest(script), styles=" " + _digest(style))
    return html, policy


def _load() -> dict[str, _File]:
    root = importlib.resources.files(__package__)
    raw = {name: root.joinpath(name).read_bytes() for name in ASSETS}
    plain = _POLICY.format(scripts="", styles="")
    files = {name: _file(name, body, plain) for name, body in raw.items()}
    page, policy = _inline(
        raw["index.html"].decode(),
        raw["console.css"].decode(),
        raw["console.js"].decode(),
        {name: raw[name].decode() for name in _IMPORTS},
    )
    files["index.html"] = _file("index.html", page.encode(), policy)
    return files


def _accepts_gzip(request: web.Request) -> bool:
    """Whether ``Accept-Encoding`` takes gzip (``gzip`` or ``*`` with a weight above 0)."""
    for item in request.headers.get("Accept-Encoding", "").split(","):
        coding, *params = (part.strip().lower() for part in item.split(";"))
        if coding not in ("gzip", "*"):
            continue
        for param in params:
            name, _, value = param.partition("=")
            if name.strip() == "q":
                try:
                    return float(value) > 0
                except ValueError:
                    return False
        return True
    return False


def _answer(request: web.Request, file: _File) -> web.Response:
    headers = {
        **_HEADERS,
        "Content-Security-Policy": file.policy,
        "ETag": file.etag,
        "Vary": "Accept-Encoding",
    }
    wanted = request.headers.get("If-None-Match", "")
    if file.etag in (tag.strip().removeprefix("W/") for tag in wanted.split(",")) or (
        wanted.strip() == "*"
    ):
        return web.Response(status=304, headers=headers)
    headers["Content-Type"] = file.type
    if _accepts_gzip(request):
        headers["Content-Encoding"] = "gzip"
        return web.Response(body=file.gzipped, headers=headers)
    return web.Response(body=file.body, headers=headers)


def add_routes(app: web.Application) -> None:
    """``GET /`` (the page) and ``GET /console/{name}`` (its scripts and style)."""
    files = _load()

    async def index(request: web.Request) -> web.Response:
        return _answer(request, files["index.html"])

    async def asset(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in files or name == "index.html":
            raise web.HTTPNotFound()
        return _answer(request, files[name])

    app.router.add_get("/", index, name="console.index")
    app.router.add_get("/console/{name}", asset, name="console.asset")
