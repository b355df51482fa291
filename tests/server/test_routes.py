"""Every route over real HTTP on loopback, with its tagged errors."""

from __future__ import annotations

import asyncio
import base64
import os
from typing import Any

import pytest
from http_helpers import Client, create_session, runtime_of
from openapi_spec_validator import validate

from protocol import events as ev
from protocol.operations import OPERATIONS, Operation
from storage import Command


async def test_the_openapi_document_is_valid_and_lists_every_operation(client: Client) -> None:
    response = await client.get("/doc")
    assert response.status == 200
    doc = await response.json()
    await asyncio.to_thread(validate, doc)  # about a second of CPU: off the loop
    ids = {op["operationId"] for path in doc["paths"].values() for op in path.values()}
    assert ids == {op.id for op in OPERATIONS}


async def prepared(client: Client) -> dict[str, str]:
    session = await create_session(client)
    sid = session["id"]
    response = await client.post(f"/api/session/{sid}/prompt", json={"text": "hi", "resume": False})
    inbox = (await response.json())["data"]["id"]
    await client.post(
        f"/api/session/{sid}/prompt", json={"text": "x", "resume": False, "id": "msg_keep"}
    )
    await runtime_of(client).sessions.promote(sid, "steer")
    response = await client.post(
        f"/api/session/{sid}/prompt", json={"text": "q", "resume": False, "delivery": "queue"}
    )
    pending = (await response.json())["data"]["id"]
    # A request as a waiting tool call records it (nobody waits on it here).
    asked = ev.PermissionAsked(
        session_id=sid,
        id="per_routes",
        tool="bash",
        call_id="call_routes",
        assistant_message_id="msg_routes",
        permission="bash",
        summary="ls",
        patterns=("ls",),
    )
    await runtime_of(client).store.append(Command.of(asked))
    await client.post(f"/api/session/{sid}/shell", json={"command": "true", "id": "msg_shell"})
    return {
        "sessionID": sid,
        "inboxID": pending,
        "messageID": inbox,
        "permissionID": asked.id,
        "shellID": "msg_shell",
        "key": "style",
    }


BODIES: dict[str, Any] = {
    "session.create": {},
    "session.update": {"title": "renamed"},
    "session.prompt": {"text": "hello", "resume": False},
    "session.synthetic": {"text": "note", "resume": False},
    "session.switchAgent": {"agent": "plan"},
    "session.switchModel": {"model": {"id": "m", "providerID": "scripted"}},
    "session.inbox.update": {"delivery": "steer"},
    "session.view": {"idle": 1},
    "session.generate": {"prompt": "#text hi"},
    "session.shell": {"command": "true"},
    "session.environment": {"variables": {"GREETING": "hi"}},
    "session.compact": {"delivery": "queue"},
    "session.permission.reply": {"reply": "once"},
    "session.instructions.entry.put": {"value": {"tone": "terse"}},
}


async def body_for(client: Client, op: Operation, params: dict[str, str]) -> Any:
    if op.id == "session.move":
        # To where it is: a directory that exists and may hold a session.
        info = await (await client.get(f"/api/session/{params['sessionID']}")).json()
        return {"directory": info["data"]["location"]["directory"]}
    if op.id == "session.importSession":
        # A copy of the prepared session under a fresh id.
        exported = await client.get(f"/api/experimental/session/{params['sessionID']}/export")
        document = await exported.json()
        document["info"]["id"] = "ses_imported" + params["sessionID"][-8:]
        return document
    if op.id == "session.revert.stage":
        return {"messageID": params["messageID"]}
    return BODIES.get(op.id)


@pytest.mark.parametrize("op", [op for op in OPERATIONS if not op.streaming], ids=lambda o: o.id)
async def test_every_declared_route_answers(client: Client, op: Operation) -> None:
    params = await prepared(client)
    url = op.url(**{k: params[k] for k in op.path_params})
    response = await client.request(op.method, url, json=await body_for(client, op, params))
    expected = 204 if op.output_kind == "no_content" else 200
    assert response.status == expected, await response.text()
    if op.output_kind == "text":
        assert response.content_type == "text/plain"
        assert await response.text()
    elif expected == 200:
        body = await response.json()
        raw_member = {"session.interrupt": "interrupted", "server.health": "healthy"}.get(
            op.id, "info"
        )
        assert (raw_member in body) if op.output_kind == "raw" else ("data" in body)


@pytest.mark.parametrize("op", [op for op in OPERATIONS if op.streaming], ids=lambda o: o.id)
async def test_every_stream_route_answers(client: Client, op: Operation) -> None:
    params = await prepared(client)
    response = await client.get(op.url(**{k: params[k] for k in op.path_params}))
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/event-stream")
    first = await response.content.readline()
    assert first.startswith((b"id:", b"event:"))
    response.close()


async def tag_of(response: Any) -> tuple[int, str]:
    return response.status, (await response.json())["_tag"]


async def test_each_error_tag_over_http(client: Client) -> None:
    sid = (await create_session(client))["id"]
    assert await tag_of(await client.get("/api/session/ses_nope")) == (404, "SessionNotFoundError")
    assert await tag_of(await client.get(f"/api/session/{sid}/message/msg_nope")) == (
        404,
        "MessageNotFoundError",
    )
    assert await tag_of(await client.get("/api/session/not-an-id")) == (400, "InvalidRequestError")
    assert await tag_of(await client.get("/api/session?cursor=garbage")) == (
        400,
        "InvalidCursorError",
    )
    assert await tag_of(await client.delete(f"/api/session/{sid}/inbox/msg_none")) == (
        409,
        "ConflictError",
    )
    assert await tag_of(await client.get("/api/nowhere")) == (404, "RouteNotFoundError")
    assert await tag_of(await client.put("/api/session")) == (405, "MethodNotAllowedError")


async def test_an_unknown_agent_is_a_tagged_400_at_creation_and_selection(
    client: Client,
) -> None:
    response = await client.post("/api/session", json={"agent": "plna"})
    assert response.status == 400
    body = await response.json()
    assert (body["_tag"], body["field"]) == ("InvalidRequestError", "agent")
    assert "unknown agent 'plna'" in body["message"]
    listed = await client.get("/api/session")
    assert (await listed.json())["data"] == []

    sid = (await create_session(client))["id"]
    response = await client.post(f"/api/session/{sid}/agent", json={"agent": "plna"})
    assert response.status == 400
    body = await response.json()
    assert (body["_tag"], body["field"]) == ("InvalidRequestError", "agent")
    response = await client.post(f"/api/session/{sid}/agent", json={"agent": "plan"})
    assert response.status == 204
    assert (await (await client.get(f"/api/session/{sid}")).json())["data"]["agent"] == "plan"


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("POST", "/api/session", b"{not json", None),
        ("POST", "/api/session", b"[1, 2]", None),
        # Only an empty body is no body: whitespace is not a JSON document.
        ("POST", "/api/session", b"\r\n", None),
        ("POST", "/api/session", b'{"id": "msg_wrongprefix"}', "id"),
        ("POST", "/api/session", b'{"title": 5}', "title"),
        ("GET", "/api/session?limit=abc", None, "limit"),
        ("GET", "/api/session?limit=0", None, "limit"),
        ("GET", "/api/session?order=sideways", None, "order"),
        ("GET", "/api/session?parentID=msg_x", None, "parentID"),
    ],
)
async def test_malformed_requests_are_tagged_400s(
    client: Client, method: str, path: str, body: bytes | None, field: str | None
) -> None:
    headers = {"Content-Type": "application/json"} if body is not None else None
    response = await client.request(method, path, data=body, headers=headers)
    status, tag = await tag_of(response)
    assert (status, tag) == (400, "InvalidRequestError")
    if field is not None:
        assert (await response.json()).get("field") == field


async def test_prompt_errors_and_receipts(client: Client) -> None:
    sid = (await create_session(client))["id"]
    bad = [
        {"text": 5},
        {"text": "x", "delivery": "later"},
        {"text": "x", "files": [{"mime": "text/plain"}]},
        {"text": "x", "files": [{"data": "!!!", "mime": "text/plain"}]},
        {"text": "x", "metadata": "nope"},
        {},
    ]
    for body in bad:
        status, tag = await tag_of(await client.post(f"/api/session/{sid}/prompt", json=body))
        assert (status, tag) == (400, "InvalidRequestError"), body
    first = await client.post(
        f"/api/session/{sid}/prompt", json={"id": "msg_one", "text": "a", "resume": False}
    )
    again = await client.post(
        f"/api/session/{sid}/prompt", json={"id": "msg_one", "text": "b", "resume": False}
    )
    assert (await first.json()) == (await again.json())
    other = (await create_session(client))["id"]
    status, tag = await tag_of(
        await client.post(f"/api/session/{other}/prompt", json={"id": "msg_one", "text": "a"})
    )
    assert (status, tag) == (409, "ConflictError")


async def test_oversize_bodies_are_413(make_client: Any) -> None:
    client = await make_client(max_body_bytes=1024)
    sid = (await create_session(client))["id"]
    big = {"text": "x" * 4096}
    response = await client.post(f"/api/session/{sid}/prompt", json=big)
    assert await tag_of(response) == (413, "PayloadTooLargeError")
    body = await response.json()
    # The real limit, not "larger than 0 bytes".
    assert body["maxBytes"] == 1024
    assert "1024" in body["message"]


async def test_released_client_compatibility(client: Client, tmp_path: Any) -> None:
    # Location from the header, URL-encoded, for a new session.
    directory = str(tmp_path / "dir with space")
    os.mkdir(directory)
    response = await client.post(
        "/api/session", json={}, headers={"x-opencode-directory": directory.replace(" ", "%20")}
    )
    session = (await response.json())["data"]
    assert session["location"]["directory"] == directory
    other = tmp_path / "q"
    other.mkdir()
    response = await client.post(f"/api/session?directory={other}", json={})
    assert (await response.json())["data"]["location"]["directory"] == str(other)
    # The nested prompt body.
    sid = session["id"]
    response = await client.post(
        f"/api/session/{sid}/prompt", json={"prompt": {"text": "nested"}, "resume": False}
    )
    assert (await response.json())["data"]["payload"] == {"text": "nested"}
    # The event alias and the old log path.
    response = await client.get("/event")
    assert (await response.content.readline()).startswith(b"event: server.connected")
    response.close()
    response = await client.get(f"/api/session/{sid}/event?after=0")
    assert (await response.content.readline()) == b"id: 1\n"
    response.close()


async def test_active_lists_running_sessions(client: Client) -> None:
    sid = (await create_session(client))["id"]
    script = '#tool bash {"command": "sleep 30"}'
    await client.post(f"/api/session/{sid}/prompt", json={"text": script})
    for _ in range(500):
        data = (await (await client.get("/api/session/active")).json())["data"]
        if "epoch" in data.get(sid, {}):  # its start took the lease
            break
        await asyncio.sleep(0.01)
    # Which host runs it, under which lease epoch (the first take).
    assert data == {sid: {"type": "running", "host": runtime_of(client).host_id, "epoch": 1}}
    response = await client.post(f"/api/session/{sid}/interrupt")
    assert await response.json() == {"interrupted": True}
    response = await client.post(f"/api/experimental/session/{sid}/wait")
    assert response.status == 204
    assert (await (await client.get("/api/session/active")).json())["data"] == {}
    response = await client.post(f"/api/session/{sid}/interrupt?resume=true")
    assert await response.json() == {"interrupted": False}


async def test_resume_answers_when_the_execution_settles(client: Client) -> None:
    sid = (await create_session(client))["id"]
    await client.post(f"/api/session/{sid}/prompt", json={"text": "hi", "resume": False})
    response = await client.post(f"/api/session/{sid}/resume")
    assert response.status == 204
    messages = (await (await client.get(f"/api/session/{sid}/message?order=asc")).json())["data"]
    assert [m["type"] for m in messages] == ["user", "assistant"]


async def test_auth_when_a_password_is_set(make_client: Any) -> None:
    client = await make_client(password="s3cret")
    for path in ("/api/session", "/doc", "/api/event"):
        response = await client.get(path)
        assert (response.status, (await response.json())["_tag"]) == (401, "UnauthorizedError")
    bearer = {"Authorization": "Bearer s3cret"}
    assert (await client.get("/api/session", headers=bearer)).status == 200
    basic = {"Authorization": "Basic " + base64.b64encode(b"anyone:s3cret").decode()}
    assert (await client.get("/doc", headers=basic)).status == 200
    wrong = {"Authorization": "Bearer nope"}
    assert (await client.get("/api/session", headers=wrong)).status == 401


async def test_without_a_password_everything_is_open(client: Client) -> None:
    assert (await client.get("/api/session")).status == 200


async def test_a_bug_is_a_500_unknown_error_with_a_reference(
    client: Client, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from server import handlers

    async def broken(call: Any) -> Any:
        raise RuntimeError("a bug in a handler")

    monkeypatch.setitem(handlers.HANDLERS, "session.get", broken)
    sid = (await create_session(client))["id"]
    response = await client.get(f"/api/session/{sid}")
    body = await response.json()
    assert (response.status, body["_tag"]) == (500, "UnknownError")
    assert "a bug" not in body["message"]  # no internals on the wire
    assert body["ref"] in caplog.text  # but the log says what it was


async def test_resume_cut_short_by_shutdown_is_503(client: Client) -> None:
    sid = (await create_session(client))["id"]
    await client.post(
        f"/api/session/{sid}/prompt",
        json={"text": '#tool bash {"command": "sleep 30"}', "resume": False},
    )
    waiting = asyncio.ensure_future(client.post(f"/api/session/{sid}/resume"))
    runtime = runtime_of(client)
    for _ in range(500):
        if sid in await runtime.execution.active():
            break
        await asyncio.sleep(0.01)
    await runtime.execution.shutdown()
    response = await waiting
    assert (response.status, (await response.json())["_tag"]) == (503, "ServiceUnavailableError")


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/api/session/{sid}/prompt", {"text": "x", "delivry": "queue"}, "delivry"),
        (
            "/api/session/{sid}/prompt",
            {"text": "x", "files": [{"uri": "data:,a", "mime": "text/plain", "nme": "a"}]},
            "files[0].nme",
        ),
        ("/api/session/{sid}/prompt", {"prompt": {"text": "x", "txt": "y"}}, "prompt.txt"),
        ("/api/session", {"titel": "t"}, "titel"),
        ("/api/session", {"model": {"id": "m", "providerID": "p", "extra": 1}}, "model.extra"),
        ("/api/session/{sid}/synthetic", {"text": "x", "resum": False}, "resum"),
    ],
)
async def test_unknown_body_fields_are_400s_naming_them(
    client: Client, path: str, body: Any, field: str
) -> None:
    sid = (await create_session(client))["id"]
    response = await client.post(path.format(sid=sid), json=body)
    assert await tag_of(response) == (400, "InvalidRequestError")
    answer = await response.json()
    assert answer["field"] == field
    assert field in answer["message"]
    # Nothing was admitted by the refused request.
    inbox = await client.get(f"/api/session/{sid}/inbox")
    assert (await inbox.json())["data"] == []


async def test_free_form_metadata_keeps_any_member(client: Client) -> None:
    sid = (await create_session(client))["id"]
    response = await client.post(
        f"/api/session/{sid}/prompt",
        json={"text": "x", "resume": False, "metadata": {"anything": {"goes": 1}}},
    )
    assert response.status == 200, await response.text()
