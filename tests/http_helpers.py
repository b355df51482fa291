"""Helpers for tests that talk HTTP to a real server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient
from aiohttp.test_utils import TestServer as _TestServer
from aiohttp.web_runner import BaseRunner

from server._protocol import make_runner
from server.app import RUNTIME

Client = TestClient[web.Request, web.Application]


class TestServer(_TestServer):
    """pytest-aiohttp's loopback server on the runner ``serve`` and the embedded host use."""

    async def _make_runner(self, **kwargs: Any) -> BaseRunner:
        return make_runner(self.app, **kwargs)


async def create_session(client: Client, **body: Any) -> dict[str, Any]:
    response = await client.post("/api/session", json=body)
    assert response.status == 200, await response.text()
    data: dict[str, Any] = (await response.json())["data"]
    return data


def runtime_of(client: Client) -> Any:
    return client.app[RUNTIME]  # type: ignore[index]


class RawResponse:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        import orjson

        return orjson.loads(self.body)


async def raw_request(port: int, data: bytes, *, guard_s: float = 30.0) -> RawResponse:
    """Send ``data`` as it is on a fresh loopback connection; read one answer to EOF.

    For what an HTTP client library would refuse to send: raw bytes in
    headers, broken chunking, bad methods. Ask with ``Connection: close``
    (or send something the server must close on) so the answer ends at EOF.
    """
    import asyncio

    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(guard_s):  # a guard, never the assertion
            raw = await reader.read()
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0].startswith("HTTP/1."), raw[:200]
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return RawResponse(status, headers, body)


async def frames(response: ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """Parse SSE frames: {'id', 'event', 'data'} or {'comment'}."""
    current: dict[str, Any] = {}
    async for raw in response.content:
        line = raw.decode().rstrip("\n")
        if not line:
            if current:
                yield current
            current = {}
        elif line.startswith(":"):
            yield {"comment": line[1:].strip()}
        else:
            key, _, value = line.partition(": ")
            current[key] = int(value) if key == "id" else value
            if key == "data":
                current["data"] = orjson.loads(value)


async def collect_until_synced(response: ClientResponse) -> list[dict[str, Any]]:
    out = []
    async for f in frames(response):
        out.append(f)
        if f.get("event") == "log.synced":
            break
    return out


async def tagged(response: ClientResponse) -> tuple[int, str]:
    """A JSON error answer's status and ``_tag``."""
    return response.status, (await response.json())["_tag"]


async def assert_guarded(client: Client, url: str, auth: dict[str, str]) -> None:
    """``GET url`` is refused without the password, from a foreign Origin and for a
    foreign Host, each with its tagged error."""
    assert await tagged(await client.get(url)) == (401, "UnauthorizedError")
    evil_origin = {**auth, "Origin": "http://evil.example"}
    assert await tagged(await client.get(url, headers=evil_origin)) == (403, "ForbiddenError")
    evil_host = {**auth, "Host": "evil.example"}
    assert await tagged(await client.get(url, headers=evil_host)) == (
        421,
        "MisdirectedRequestError",
    )
