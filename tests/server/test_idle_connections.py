"""An idle keep-alive connection holds no request or response body.

aiohttp's connection loop keeps its last request and response referenced
until the next request arrives on that connection; whatever they carry stays
resident as long as the client is idle. The server must let go of both
bodies once they are used.
"""

from __future__ import annotations

import gc
import io
from typing import Any

import orjson
from aiohttp import web
from http_helpers import Client, create_session

BIG = 2_000_000


def _large_bodies_alive() -> list[str]:
    """What still references a body of at least ``BIG`` bytes on a live request/response."""
    found = []
    for obj in gc.get_objects():
        if isinstance(obj, web.Response):
            body = obj.body
            if isinstance(body, bytes | bytearray) and len(body) >= BIG:
                found.append(f"response {obj.status} with {len(body)} bytes")
        elif isinstance(obj, web.BaseRequest):
            cached = getattr(obj, "_read_bytes", None)
            if cached is not None and len(cached) >= BIG:
                found.append(f"request {obj.method} {obj.path} with {len(cached)} bytes")
    return found


async def _post_json(client: Client, path: str, body: dict[str, Any]) -> None:
    # A stream, not bytes: aiohttp's client warns of large bytes bodies.
    response = await client.post(
        path,
        data=io.BytesIO(orjson.dumps(body)),
        headers={"content-type": "application/json"},
    )
    assert response.status == 200, await response.text()
    await response.read()


async def test_a_prompt_body_is_not_kept_by_its_idle_connection(client: Client) -> None:
    session = await create_session(client)
    text = "x" * (BIG + 10)
    await _post_json(
        client, f"/api/session/{session['id']}/prompt", {"text": text, "resume": False}
    )
    # The connection stays open and idle in the client's pool.
    gc.collect()
    assert _large_bodies_alive() == []


async def test_a_large_answer_is_not_kept_by_its_idle_connection(client: Client) -> None:
    session = await create_session(client)
    text = "y" * (BIG + 10)
    await _post_json(
        client, f"/api/session/{session['id']}/prompt", {"text": text, "resume": False}
    )
    response = await client.post(f"/api/session/{session['id']}/prompt", json={"text": "go"})
    assert response.status == 200
    wait = await client.post(f"/api/experimental/session/{session['id']}/wait")
    assert wait.status < 300
    answer = await client.get(f"/api/session/{session['id']}/message?limit=10")
    assert answer.status == 200
    assert len(await answer.read()) >= BIG
    gc.collect()
    assert _large_bodies_alive() == []


async def test_a_body_over_the_limit_is_still_a_tagged_413(make_client: object) -> None:
    client = await make_client(max_body_bytes=1000)  # type: ignore[operator]
    session = await create_session(client)
    response = await client.post(
        f"/api/session/{session['id']}/prompt", json={"text": "z" * 5000, "resume": False}
    )
    assert response.status == 413
    body = await response.json()
    assert body["_tag"] == "PayloadTooLargeError"
    assert body["maxBytes"] == 1000
    chunked = await client.post(
        f"/api/session/{session['id']}/prompt",
        data=_chunks(b'{"text": "' + b"z" * 5000 + b'"}'),
        headers={"content-type": "application/json"},
    )
    assert chunked.status == 413


async def _chunks(data: bytes):  # type: ignore[no-untyped-def]
    for start in range(0, len(data), 500):
        yield data[start : start + 500]


async def test_a_long_answer_goes_out_in_pieces_and_arrives_whole(client: Client) -> None:
    """Bodies over a piece (1 MiB) are written piece by piece, each taken by the
    socket before the next: the same bytes, the same Content-Length; none for HEAD."""
    session = await create_session(client)
    text = "".join(chr(ord("a") + i % 26) for i in range(3 * BIG + 7))
    await _post_json(client, f"/api/session/{session['id']}/prompt", {"text": text})
    wait = await client.post(f"/api/experimental/session/{session['id']}/wait")
    assert wait.status < 300
    path = f"/api/session/{session['id']}/message?limit=1&order=asc"
    answer = await client.get(path)
    assert answer.status == 200
    raw = await answer.read()
    assert int(answer.headers["Content-Length"]) == len(raw) > 3 * BIG
    [message] = orjson.loads(raw)["data"]
    assert message["text"] == text
    head = await client.head(path)
    assert head.status == 200
    assert await head.read() == b""
