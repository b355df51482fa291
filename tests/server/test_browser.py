"""What a web page can make a browser send, against a real server on loopback.

A page on any site may send ``POST`` with a "simple" content type (text/plain,
a form, multipart) cross-site without a preflight, may point its own DNS name
at 127.0.0.1 (rebinding) and then read the answers, and may ask for CORS with
a preflight. None of that may drive the server; pages of an origin the
operator allowed, and clients that are not browsers, keep working.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from http_helpers import Client, create_session

from protocol.client import Client as ApiClient
from protocol.errors import ForbiddenError
from protocol.requests import CreateSessionInput, PromptInput

MakeClient = Callable[..., Awaitable[Client]]
EVIL = "http://evil.example"


async def tag_of(response: aiohttp.ClientResponse) -> tuple[int, str]:
    assert response.content_type == "application/json", await response.text()
    return response.status, (await response.json())["_tag"]


async def session_ids(client: Client) -> set[str]:
    response = await client.get("/api/session")
    assert response.status == 200
    return {s["id"] for s in (await response.json())["data"]}


SIMPLE = ["text/plain", "text/plain;charset=UTF-8", "urlencoded", "form", "multipart"]


def simple_body(kind: str) -> tuple[Any, dict[str, str]]:
    """A body a page may POST cross-site without a preflight, and its headers."""
    if kind.startswith("text/plain"):
        return '{"id": "ses_attacker", "text": "#tool bash {}"}', {"Content-Type": kind}
    if kind == "urlencoded":
        return '{"id":"ses_attacker"}', {"Content-Type": "application/x-www-form-urlencoded"}
    form = aiohttp.FormData()
    form.add_field("text", "#tool bash {}")
    if kind == "multipart":
        form.add_field("file", b"x", filename="x.txt", content_type="text/plain")
    return form, {}


@pytest.mark.parametrize("kind", SIMPLE)
@pytest.mark.parametrize("origin", [None, EVIL])
async def test_simple_cross_site_bodies_drive_nothing(
    client: Client, kind: str, origin: str | None
) -> None:
    sid = (await create_session(client))["id"]
    before = await session_ids(client)
    for method, path in (
        ("POST", "/api/session"),
        ("POST", f"/api/session/{sid}/prompt"),
        ("PATCH", f"/api/session/{sid}"),
    ):
        data, headers = simple_body(kind)
        if origin:
            headers["Origin"] = origin
        response = await client.request(method, path, data=data, headers=headers)
        expected = (403, "ForbiddenError") if origin else (415, "UnsupportedMediaTypeError")
        assert await tag_of(response) == expected
        assert "Access-Control-Allow-Origin" not in response.headers
    assert await session_ids(client) == before
    inbox = await (await client.get(f"/api/session/{sid}/inbox")).json()
    assert inbox["data"] == []
    # The client-chosen id did not come into being either.
    assert (await client.get("/api/session/ses_attacker")).status == 404


@pytest.mark.parametrize("method", ["GET", "POST", "DELETE"])
async def test_a_foreign_origin_is_refused_before_anything_runs(
    client: Client, method: str
) -> None:
    sid = (await create_session(client))["id"]
    path = {"GET": "/api/session", "POST": "/api/session", "DELETE": f"/api/session/{sid}"}
    response = await client.request(method, path[method], json={}, headers={"Origin": EVIL})
    assert await tag_of(response) == (403, "ForbiddenError")
    assert (await client.get(f"/api/session/{sid}")).status == 200


@pytest.mark.parametrize(
    "origin", ["null", "http://127.0.0.1.evil.example", "file://", "http://localhost:1", "\xff"]
)
async def test_origins_that_are_not_ours_are_refused(client: Client, origin: str) -> None:
    response = await client.post("/api/session", json={}, headers={"Origin": origin})
    assert await tag_of(response) == (403, "ForbiddenError")


async def test_the_servers_own_loopback_origins_pass(client: Client) -> None:
    port = client.port
    for origin in (f"http://127.0.0.1:{port}", f"http://localhost:{port}"):
        response = await client.post("/api/session", json={}, headers={"Origin": origin})
        assert response.status == 200, await response.text()


@pytest.mark.parametrize("site", ["cross-site", "same-site"])
@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_sec_fetch_site_cross_site_is_refused(client: Client, site: str, method: str) -> None:
    # A no-cors request (an <img>, a <form>) may come without Origin; the
    # browser still says where it comes from.
    response = await client.request(
        method, "/api/session", json={}, headers={"Sec-Fetch-Site": site}
    )
    assert await tag_of(response) == (403, "ForbiddenError")
    for ok in ("same-origin", "none"):
        response = await client.request(
            method, "/api/session", json={}, headers={"Sec-Fetch-Site": ok}
        )
        assert response.status == 200


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:{port}", "127.0.0.1.nip.io:{port}", "[::2]", "0"]
)
async def test_a_foreign_host_is_refused_so_rebinding_reads_nothing(
    client: Client, host: str
) -> None:
    header = host.format(port=client.port)
    for method, path in (("GET", "/api/session"), ("POST", "/api/session"), ("GET", "/doc")):
        response = await client.request(method, path, json={}, headers={"Host": header})
        assert await tag_of(response) == (421, "MisdirectedRequestError")
    assert await session_ids(client) == set()


@pytest.mark.parametrize(
    "host", ["localhost:{port}", "LOCALHOST", "127.0.0.1:{port}", "127.5.6.7", "[::1]:{port}"]
)
async def test_loopback_hosts_are_ours(client: Client, host: str) -> None:
    response = await client.get("/api/session", headers={"Host": host.format(port=client.port)})
    assert response.status == 200


async def test_a_configured_host_name_is_ours(make_client: MakeClient) -> None:
    client = await make_client(allowed_hosts=["sessionrt.lan"])
    assert (await client.get("/api/session", headers={"Host": "sessionrt.lan:80"})).status == 200
    response = await client.get("/api/session", headers={"Host": "other.lan"})
    assert await tag_of(response) == (421, "MisdirectedRequestError")


async def test_preflight_from_a_foreign_origin_is_refused(client: Client) -> None:
    response = await client.options(
        "/api/session",
        headers={
            "Origin": EVIL,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type",
        },
    )
    assert await tag_of(response) == (403, "ForbiddenError")
    assert "Access-Control-Allow-Origin" not in response.headers


async def test_a_configured_origin_gets_cors(make_client: MakeClient) -> None:
    app = "https://app.example"
    client = await make_client(cors_origins=[app])
    preflight = await client.options(
        "/api/session",
        headers={
            "Origin": app,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type, authorization",
        },
    )
    assert preflight.status == 204
    assert preflight.headers["Access-Control-Allow-Origin"] == app
    assert "POST" in preflight.headers["Access-Control-Allow-Methods"]
    allowed = preflight.headers["Access-Control-Allow-Headers"].lower()
    assert "content-type" in allowed
    assert "authorization" in allowed
    response = await client.post(
        "/api/session", json={"title": "from the app"}, headers={"Origin": app}
    )
    assert response.status == 200
    assert response.headers["Access-Control-Allow-Origin"] == app
    assert "Origin" in response.headers.getall("Vary")
    # Errors are readable by the allowed page too; other origins still are not allowed.
    missing = await client.get("/api/session/ses_missing", headers={"Origin": app})
    assert missing.status == 404
    assert missing.headers["Access-Control-Allow-Origin"] == app
    other = await client.post("/api/session", json={}, headers={"Origin": EVIL})
    assert await tag_of(other) == (403, "ForbiddenError")
    # A configured origin still may not send a simple body.
    plain = await client.post(
        "/api/session", data="{}", headers={"Origin": app, "Content-Type": "text/plain"}
    )
    assert await tag_of(plain) == (415, "UnsupportedMediaTypeError")


async def test_refusals_come_before_authentication(make_client: MakeClient) -> None:
    client = await make_client(password="hunter2")
    response = await client.post("/api/session", json={}, headers={"Origin": EVIL})
    assert await tag_of(response) == (403, "ForbiddenError")
    response = await client.get("/api/session", headers={"Host": "evil.example"})
    assert await tag_of(response) == (421, "MisdirectedRequestError")
    response = await client.get("/api/session")
    assert await tag_of(response) == (401, "UnauthorizedError")


async def test_posts_without_a_body_need_no_content_type(client: Client) -> None:
    sid = (await create_session(client))["id"]
    response = await client.post(
        f"/api/session/{sid}/interrupt", skip_auto_headers=["Content-Type"]
    )
    assert response.status == 200
    assert await response.json() == {"interrupted": False}
    response = await client.post(f"/api/session/{sid}/interrupt", headers={"Origin": EVIL})
    assert await tag_of(response) == (403, "ForbiddenError")


async def test_the_python_client_over_tcp_keeps_working(client: Client) -> None:
    async with ApiClient(str(client.make_url(""))) as api:
        session = await api.sessions.create(CreateSessionInput(title="python"))
        receipt = await api.sessions.prompt(session.id, PromptInput(text="hello"))
        assert receipt.session_id == session.id
    assert session.id in await session_ids(client)


async def test_the_python_client_sees_a_refusal_as_its_tag(client: Client) -> None:
    url = str(client.make_url(""))
    async with ApiClient(url, headers={"Origin": EVIL}) as api:
        with pytest.raises(ForbiddenError):
            await api.sessions.create(CreateSessionInput())


async def test_streams_refuse_foreign_pages_too(client: Client) -> None:
    sid = (await create_session(client))["id"]
    for path in ("/api/event", f"/api/experimental/session/{sid}/log?follow=true"):
        response = await client.get(path, headers={"Origin": EVIL})
        assert await tag_of(response) == (403, "ForbiddenError")
        response = await client.get(path, headers={"Host": "evil.example"})
        assert await tag_of(response) == (421, "MisdirectedRequestError")
