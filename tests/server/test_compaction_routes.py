"""POST /compact and GET /context over real HTTP on loopback, and through the embedded host."""

from __future__ import annotations

from pathlib import Path

from http_helpers import Client, create_session, runtime_of

from protocol.requests import CompactInput, PromptInput
from server.embedded import Embedded


async def test_compact_admits_one_pending_control_item(client: Client) -> None:
    sid = (await create_session(client))["id"]
    for text in ("first question", "second question"):
        response = await client.post(f"/api/session/{sid}/prompt", json={"text": text})
        assert response.status == 200
        await runtime_of(client).execution.wait_idle(sid)
    # Queued while idle: it waits for the idle boundary, which comes at once.
    response = await client.post(
        f"/api/session/{sid}/compact", json={"id": "msg_compact1", "delivery": "steer"}
    )
    assert response.status == 200, await response.text()
    item = (await response.json())["data"]
    assert (item["id"], item["type"], item["delivery"], item["payload"]) == (
        "msg_compact1",
        "compaction",
        "steer",
        {},
    )
    await runtime_of(client).execution.wait_idle(sid)
    response = await client.get(f"/api/session/{sid}/context")
    context = (await response.json())["data"]
    assert context[0]["type"] == "compaction"
    assert context[0]["status"] == "completed"
    assert context[0]["inputID"] == "msg_compact1"
    assert "## Objective" in context[0]["text"]
    assert "second question" in context[0]["recent"]
    # A delivered id conflicts; the transcript keeps everything.
    response = await client.post(f"/api/session/{sid}/compact", json={"id": "msg_compact1"})
    assert (response.status, (await response.json())["_tag"]) == (409, "ConflictError")
    response = await client.get(f"/api/session/{sid}/message?order=asc")
    types = [m["type"] for m in (await response.json())["data"]]
    assert types == ["user", "assistant", "user", "assistant", "compaction"]


async def test_compact_refuses_bad_input_with_tags(client: Client) -> None:
    sid = (await create_session(client))["id"]
    response = await client.post(f"/api/session/{sid}/compact", json={"id": "ses_wrong"})
    assert (response.status, (await response.json())["_tag"]) == (400, "InvalidRequestError")
    response = await client.post(f"/api/session/{sid}/compact", json={"delivery": "later"})
    assert (response.status, (await response.json())["_tag"]) == (400, "InvalidRequestError")
    response = await client.post("/api/session/ses_missing/compact", json={})
    assert (response.status, (await response.json())["_tag"]) == (404, "SessionNotFoundError")
    response = await client.get("/api/session/ses_missing/context")
    assert (response.status, (await response.json())["_tag"]) == (404, "SessionNotFoundError")


async def test_a_pending_compaction_is_returned_again_and_listed(client: Client) -> None:
    sid = (await create_session(client))["id"]
    await client.post(f"/api/session/{sid}/prompt", json={"text": "parked", "resume": False})
    runtime = runtime_of(client)
    first = await runtime.sessions.inbox.compact(sid, "msg_pendingc", "queue", resume=False)
    response = await client.post(f"/api/session/{sid}/compact", json={"id": "msg_othercomp"})
    assert (await response.json())["data"]["id"] == first.id
    listed = (await (await client.get(f"/api/session/{sid}/inbox")).json())["data"]
    assert [i["type"] for i in listed] == ["user", "compaction"]


async def test_the_embedded_host_compacts(tmp_path: Path) -> None:
    async with Embedded(tmp_path / "data") as oc:
        session = await oc.sessions.create()
        for text in ("first question", "second question"):
            await oc.sessions.prompt(session.id, PromptInput(text=text))
            await oc.sessions.wait(session.id)
        item = await oc.sessions.compact(session.id, CompactInput())
        assert item.type == "compaction"
        await oc.sessions.wait(session.id)
        context = await oc.sessions.context(session.id)
        assert [m.type for m in context] == ["compaction"]
