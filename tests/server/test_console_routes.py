"""The console's files over HTTP: from the package, same-origin only, no data without a password."""

from __future__ import annotations

import base64
import hashlib
import importlib.resources
import re
from typing import Any

from http_helpers import Client

from server.console import ASSETS


def test_the_console_files_are_package_data() -> None:
    root = importlib.resources.files("server.console")
    for name in ASSETS:
        assert root.joinpath(name).read_bytes()


async def test_the_page_and_its_assets_are_served_with_a_strict_policy(client: Client) -> None:
    page = await client.get("/")
    assert page.status == 200
    assert page.headers["Content-Type"] == "text/html; charset=utf-8"
    html = await page.text()
    assert '<script type="module">' in html
    assert not re.search(r"https?://", html)  # nothing from another origin
    policy = page.headers["Content-Security-Policy"]
    assert "default-src 'none'" in policy
    assert "frame-ancestors 'none'" in policy
    script = await client.get("/console/console.js")
    assert script.headers["Content-Type"].startswith("text/javascript")
    assert script.headers["X-Content-Type-Options"] == "nosniff"
    for missing in ("/console/index.html", "/console/..%2Fapp.py", "/console/nope.js"):
        response = await client.get(missing)
        assert response.status == 404, missing
        assert (await response.json())["_tag"] == "RouteNotFoundError"


async def test_a_password_covers_the_data_but_not_the_page(make_client: Any) -> None:
    client = await make_client(password="pw")
    assert (await client.get("/")).status == 200
    assert (await client.get("/console/console.js")).status == 200
    refused = await client.get("/api/session")
    assert refused.status == 401
    assert refused.headers["WWW-Authenticate"].startswith("Basic")
    # A page script's fetch gets a challenge the browser does not answer with its own dialog.
    scripted = await client.get("/api/session", headers={"Sec-Fetch-Mode": "cors"})
    assert scripted.status == 401
    assert scripted.headers["WWW-Authenticate"].startswith("Bearer")


async def test_the_page_is_refused_under_a_foreign_host_or_origin(client: Client) -> None:
    assert (await client.get("/", headers={"Host": "evil.example"})).status == 421
    foreign = await client.get("/", headers={"Sec-Fetch-Site": "cross-site"})
    assert foreign.status == 403


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


async def test_the_page_inlines_its_style_and_script_allowed_by_their_hashes(
    client: Client,
) -> None:
    page = await client.get("/")
    html = await page.text()
    policy = page.headers["Content-Security-Policy"]
    style = re.search(r"<style>(.*?)</style>", html, re.S)
    script = re.search(r'<script type="module">(.*?)</script>', html, re.S)
    assert style
    assert script
    assert "<link" not in html  # nothing to fetch before the first paint
    assert "src=" not in html.replace("script-src", "")
    assert f"script-src 'self' {_sha256(script.group(1))};" in policy
    assert f"style-src 'self' {_sha256(style.group(1))};" in policy
    assert "unsafe-inline" not in policy
    # The shared SSE reader is put in place of its import: one parser, no fetch.
    assert "async function readFrames(" in script.group(1)
    assert not re.search(r"^\s*(import|export)\b", script.group(1), re.M)
    # Alone, the files stay modules that import the one reader.
    for name in ("console.js", "console-feed.js"):
        alone = await (await client.get(f"/console/{name}")).text()
        assert re.search(r'^import \{ readFrames \} from "[./a-z]*console-sse.js";$', alone, re.M)
        assert 'indexOf("\\n\\n")' not in alone  # no second parser
    # No hash from the page leaks into the files' own policy.
    alone_policy = (await client.get("/console/console.js")).headers["Content-Security-Policy"]
    assert "sha256" not in alone_policy


async def test_the_files_revalidate_with_etags_and_travel_gzipped(client: Client) -> None:
    for path in ("/", "/console/console-sse.js", "/console/console-feed.js"):
        plain = await client.get(path, headers={"Accept-Encoding": "identity"})
        assert plain.status == 200
        assert "Content-Encoding" not in plain.headers
        body = await plain.read()
        etag = plain.headers["ETag"]
        assert plain.headers["Cache-Control"] == "no-cache"
        zipped = await client.get(path, headers={"Accept-Encoding": "br, gzip;q=0.8"})
        assert zipped.headers["Content-Encoding"] == "gzip"
        assert zipped.headers["Vary"] == "Accept-Encoding"
        assert await zipped.read() == body  # the same bytes, decompressed
        assert int(zipped.headers["Content-Length"]) < len(body)
        refused = await client.get(path, headers={"Accept-Encoding": "gzip;q=0"})
        assert "Content-Encoding" not in refused.headers
        same = await client.get(path, headers={"If-None-Match": f'"x", {etag}'})
        assert same.status == 304
        assert await same.read() == b""
        assert same.headers["ETag"] == etag
        changed = await client.get(path, headers={"If-None-Match": '"not-it"'})
        assert changed.status == 200
        assert await changed.read() == body


async def test_a_revalidation_passes_the_same_guards_as_the_file(make_client: Any) -> None:
    client = await make_client(password="pw")
    first = await client.get("/console/console-sse.js")
    again = await client.get(
        "/console/console-sse.js", headers={"If-None-Match": first.headers["ETag"]}
    )
    assert again.status == 304
    # A foreign page cannot use a revalidation to probe the files either.
    foreign = await client.get(
        "/console/console-sse.js",
        headers={"If-None-Match": first.headers["ETag"], "Sec-Fetch-Site": "cross-site"},
    )
    assert foreign.status == 403
