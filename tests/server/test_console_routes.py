"""The console's files over HTTP: from the package, same-origin only, no data without a password."""

from __future__ import annotations

import importlib.resources
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
    assert '<script src="/console/console.js"' in html
    assert "http" not in html.replace("http-equiv", "")  # nothing from another origin
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
