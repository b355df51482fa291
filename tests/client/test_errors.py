"""Declared failures raise their tagged DomainError; everything else is one ClientError."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from client.fake_server import SESSION, FakeServer

from protocol.client import CallOptions, Client, ClientError
from protocol.errors import (
    ConflictError,
    InvalidRequestError,
    SessionBusyError,
    SessionNotFoundError,
)
from protocol.requests import CreateSessionInput, PromptInput


async def test_session_not_found_is_raised_typed(client: Client, fake: FakeServer) -> None:
    fake.json(
        "GET",
        "/api/session/ses_404",
        {"_tag": "SessionNotFoundError", "message": "Session not found", "sessionID": "ses_404"},
        status=404,
    )

    with pytest.raises(SessionNotFoundError) as caught:
        await client.sessions.get("ses_404")

    assert caught.value.tag == "SessionNotFoundError"
    assert caught.value.fields == {"sessionID": "ses_404"}
    assert caught.value.session_id == "ses_404"
    assert caught.value.message == "Session not found"


async def test_conflict_carries_its_fields(client: Client, fake: FakeServer) -> None:
    fake.json(
        "POST",
        "/api/session/ses_1/prompt",
        {"_tag": "ConflictError", "message": "id reused", "resource": "inbox"},
        status=409,
    )

    with pytest.raises(ConflictError) as caught:
        await client.sessions.prompt("ses_1", PromptInput(id="msg_1", text="again"))

    assert caught.value == ConflictError("id reused", resource="inbox")


async def test_invalid_request_carries_kind_and_field(client: Client, fake: FakeServer) -> None:
    fake.json(
        "POST",
        "/api/session",
        {
            "_tag": "InvalidRequestError",
            "message": "id must start with ses_",
            "kind": "id",
            "field": "id",
        },
        status=400,
    )

    with pytest.raises(InvalidRequestError) as caught:
        await client.sessions.create(CreateSessionInput(title="x"))

    assert caught.value.fields == {"kind": "id", "field": "id"}


async def test_a_known_tag_the_op_does_not_declare_is_still_typed(
    client: Client, fake: FakeServer
) -> None:
    fake.json(
        "GET",
        "/api/session/ses_1",
        {"_tag": "SessionBusyError", "message": "busy", "sessionID": "ses_1"},
        status=409,
    )

    with pytest.raises(SessionBusyError):
        await client.sessions.get("ses_1")


async def test_an_unknown_tag_is_an_unexpected_status(client: Client, fake: FakeServer) -> None:
    fake.json("GET", "/api/session/ses_1", {"_tag": "TeapotError", "message": "no"}, status=418)

    with pytest.raises(ClientError) as caught:
        await client.sessions.get("ses_1")

    assert caught.value.reason == "unexpected_status"
    assert caught.value.status == 418


async def test_a_502_html_page_is_an_unexpected_status(client: Client, fake: FakeServer) -> None:
    fake.raw(
        "GET",
        "/api/session/ses_1",
        b"<html>Bad Gateway</html>",
        status=502,
        content_type="text/html",
    )

    with pytest.raises(ClientError) as caught:
        await client.sessions.get("ses_1")

    assert caught.value.reason == "unexpected_status"
    assert caught.value.status == 502
    assert "Bad Gateway" in str(caught.value)


async def test_a_success_that_is_not_json_is_an_unsupported_content_type(
    client: Client, fake: FakeServer
) -> None:
    fake.raw("GET", "/api/session/ses_1", b"<html>hi</html>", content_type="text/html")

    with pytest.raises(ClientError) as caught:
        await client.sessions.get("ses_1")

    assert caught.value.reason == "unsupported_content_type"
    assert caught.value.status == 200


async def test_malformed_json_is_a_malformed_response(client: Client, fake: FakeServer) -> None:
    fake.raw("GET", "/api/session/ses_1", b'{"data": {', content_type="application/json")

    with pytest.raises(ClientError) as caught:
        await client.sessions.get("ses_1")

    assert caught.value.reason == "malformed_response"
    assert caught.value.status == 200


@pytest.mark.parametrize(
    "body",
    [
        [SESSION],
        {"session": SESSION},
        {"data": {**SESSION, "time": "yesterday"}},
        {"data": {k: v for k, v in SESSION.items() if k != "id"}},
    ],
    ids=["not-an-envelope", "no-data-member", "wrong-member-type", "missing-member"],
)
async def test_json_of_the_wrong_shape_is_a_malformed_response(
    client: Client, fake: FakeServer, body: object
) -> None:
    fake.json("GET", "/api/session/ses_1", body)

    with pytest.raises(ClientError) as caught:
        await client.sessions.get("ses_1")

    assert caught.value.reason == "malformed_response"


async def test_items_that_are_not_an_array_are_malformed(client: Client, fake: FakeServer) -> None:
    fake.json("GET", "/api/session/ses_1/inbox", {"data": {"id": "msg_1"}})

    with pytest.raises(ClientError) as caught:
        await client.sessions.inbox("ses_1")

    assert caught.value.reason == "malformed_response"


async def test_no_content_where_a_body_is_due_is_an_unexpected_status(
    client: Client, fake: FakeServer
) -> None:
    fake.no_content("GET", "/api/session/ses_1")

    with pytest.raises(ClientError) as caught:
        await client.sessions.get("ses_1")

    assert caught.value.reason == "unexpected_status"
    assert caught.value.status == 204


async def test_a_redirect_is_not_followed(client: Client, fake: FakeServer) -> None:
    async def redirect(request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound("/elsewhere")

    fake.on("GET", "/api/session/ses_1", redirect)

    with pytest.raises(ClientError) as caught:
        await client.sessions.get("ses_1")

    assert (caught.value.reason, caught.value.status) == ("unexpected_status", 302)
    assert len(fake.requests) == 1


async def test_a_refused_connection_is_a_transport_error(unused_tcp_port: int) -> None:
    async with Client(f"http://127.0.0.1:{unused_tcp_port}") as client:
        with pytest.raises(ClientError) as caught:
            await client.sessions.get("ses_1")

    assert caught.value.reason == "transport"
    assert caught.value.status is None
    assert caught.value.operation == "session.get"


async def test_a_per_call_timeout_is_a_transport_error(client: Client, fake: FakeServer) -> None:
    fake.hang("POST", "/api/session/ses_1/resume")

    with pytest.raises(ClientError) as caught:
        await client.sessions.resume("ses_1", options=CallOptions(timeout=0.05))

    assert caught.value.reason == "transport"
    assert "timed out" in str(caught.value)
    async with asyncio.timeout(5):
        await fake.disconnected.wait()


async def test_the_client_timeout_applies_to_every_call(fake: FakeServer) -> None:
    fake.hang("POST", "/api/experimental/session/ses_1/wait")

    async with Client(fake.url, timeout=0.05) as client:
        with pytest.raises(ClientError) as caught:
            await client.sessions.wait("ses_1")

    assert caught.value.reason == "transport"


async def test_cancelling_the_task_cancels_the_call_and_closes_the_connection(
    client: Client, fake: FakeServer
) -> None:
    fake.hang("POST", "/api/session/ses_1/resume")

    call = asyncio.create_task(client.sessions.resume("ses_1", options=CallOptions(timeout=None)))
    async with asyncio.timeout(5):
        await fake.arrived.wait()
    call.cancel()

    with pytest.raises(asyncio.CancelledError):
        await call
    async with asyncio.timeout(5):
        await fake.disconnected.wait()


async def test_headers_of_client_and_call_reach_the_server(fake: FakeServer) -> None:
    fake.json("GET", "/api/session/ses_1", {"data": SESSION})

    async with Client(
        fake.url, headers={"Authorization": "Bearer client", "X-Client": "yes"}
    ) as client:
        await client.sessions.get("ses_1")
        await client.sessions.get(
            "ses_1",
            options=CallOptions(headers={"Authorization": "Bearer call", "X-Trace": "t1"}),
        )

    first, second = fake.requests
    assert first.headers["Authorization"] == "Bearer client"
    assert first.headers["X-Client"] == "yes"
    assert "X-Trace" not in first.headers
    assert second.headers["Authorization"] == "Bearer call"
    assert second.headers["X-Client"] == "yes"
    assert second.headers["X-Trace"] == "t1"
