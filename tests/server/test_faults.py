"""No 500 from anything a client sends; aiohttp's own refusals tagged too.

Each case here was a 500 or an untagged text/plain answer; raw sockets send
the bytes an HTTP library would clean up first.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from http_helpers import Client, RawResponse, create_session, raw_request

MakeClient = Callable[..., Awaitable[Client]]


def request(method: str, path: str, *headers: bytes, body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: 127.0.0.1", b"Connection: close"]
    lines += list(headers)
    if body:
        lines += [b"Content-Type: application/json", b"Content-Length: %d" % len(body)]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def tagged(response: RawResponse) -> tuple[int, str]:
    assert response.headers.get("content-type", "").startswith("application/json"), response.body
    body = response.json()
    assert body["message"]
    return response.status, body["_tag"]


@pytest.mark.parametrize(
    "value",
    ["²".encode(), b"9" * 5000, b"99999999999999999999", b"-1", b"\xff", b"1e3", b"\xd9\xa3"],
)
async def test_a_bad_last_event_id_is_a_400(client: Client, value: bytes) -> None:
    sid = (await create_session(client))["id"]
    response = await raw_request(
        client.port,
        request("GET", f"/api/experimental/session/{sid}/log", b"Last-Event-ID: " + value),
    )
    assert tagged(response) == (400, "InvalidRequestError")


async def test_a_good_last_event_id_still_resumes(client: Client) -> None:
    sid = (await create_session(client))["id"]
    response = await client.get(
        f"/api/experimental/session/{sid}/log", headers={"Last-Event-ID": "1"}
    )
    assert response.status == 200
    assert "id: 1\n" not in await response.text()


@pytest.mark.parametrize("value", [b"\xff", b"/tmp/\xc3\x28", b"%ff", b"%2Ftmp%C3%28"])
async def test_a_directory_header_that_is_not_utf8_is_a_400(client: Client, value: bytes) -> None:
    response = await raw_request(
        client.port, request("POST", "/api/session", b"x-opencode-directory: " + value, body=b"{}")
    )
    assert tagged(response) == (400, "InvalidRequestError")


@pytest.mark.parametrize("value", [b"Bearer \xff", b"Basic \xff\xfe", b"\xff", b"Bearer"])
async def test_garbage_credentials_are_a_401(make_client: MakeClient, value: bytes) -> None:
    client = await make_client(password="hunter2")
    response = await raw_request(
        client.port, request("GET", "/api/session", b"Authorization: " + value)
    )
    assert tagged(response) == (401, "UnauthorizedError")


@pytest.mark.parametrize(
    "data",
    [
        # a chunk size that is not hex
        b"POST /api/session HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
        # a request line far over aiohttp's limit
        b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        # a header line far over it
        b"GET /api/session HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Long: " + b"a" * 20000 + b"\r\n\r\n",
        # not a method
        b"G(T /api/session HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        # not HTTP at all
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",
        # two Content-Lengths that disagree
        b"POST /api/session HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n"
        b"Content-Length: 3\r\n\r\n{}",
    ],
    ids=["chunk-size", "long-request-line", "long-header", "bad-method", "tls", "two-lengths"],
)
async def test_unparsable_requests_are_tagged_400s(client: Client, data: bytes) -> None:
    response = await raw_request(client.port, data)
    status, tag = tagged(response)
    assert (status, tag) == (400, "InvalidRequestError")
    assert response.json()["kind"] == "http"


async def test_head_works_on_get_routes(client: Client) -> None:
    sid = (await create_session(client))["id"]
    for path in (
        "/api/session",
        f"/api/session/{sid}",
        f"/api/session/{sid}/message",
        "/api/session/active",
        "/doc",
        "/api/event",
        f"/api/experimental/session/{sid}/log?follow=true",
        f"/api/session/{sid}/event",
    ):
        response = await client.head(path)
        assert response.status == 200, path
        assert await response.read() == b""
    missing = await client.head("/api/session/ses_missing")
    assert missing.status == 404
    log = await client.head("/api/experimental/session/ses_missing/log")
    assert log.status == 404
