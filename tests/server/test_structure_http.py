"""Fork, view, generate, export/import and stats over real HTTP on loopback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from http_helpers import Client, create_session, runtime_of


async def settled_turn(client: Client, sid: str, text: str) -> None:
    response = await client.post(f"/api/session/{sid}/prompt", json={"text": text})
    assert response.status == 200
    assert (await client.post(f"/api/experimental/session/{sid}/wait")).status == 204


async def transcript(client: Client, sid: str) -> list[dict[str, Any]]:
    response = await client.get(f"/api/session/{sid}/message?order=asc")
    data: list[dict[str, Any]] = (await response.json())["data"]
    return data


async def test_fork_over_http(client: Client) -> None:
    sid = (await create_session(client, title="origin"))["id"]
    await settled_turn(client, sid, "#text one")
    await settled_turn(client, sid, "#text two")
    messages = await transcript(client, sid)

    whole = await client.post(f"/api/session/{sid}/fork")
    assert whole.status == 200
    child = (await whole.json())["data"]
    assert child["forkSessionID"] == sid
    assert child["forkBoundary"] == {"type": "through", "messageID": messages[-1]["id"]}
    assert child["title"] == "origin (fork #1)"
    assert "parentID" not in child
    assert len(await transcript(client, child["id"])) == 4

    cut = await client.post(f"/api/session/{sid}/fork", json={"before": messages[2]["id"]})
    part = (await cut.json())["data"]
    assert [m["type"] for m in await transcript(client, part["id"])] == ["user", "assistant"]

    missing = await client.post(f"/api/session/{sid}/fork", json={"before": "msg_nope"})
    assert missing.status == 404
    assert (await missing.json())["_tag"] == "MessageNotFoundError"
    bad = await client.post(f"/api/session/{sid}/fork", json={"before": 3})
    assert bad.status == 400
    gone = await client.post("/api/session/ses_nope/fork")
    assert gone.status == 404
    assert (await gone.json())["_tag"] == "SessionNotFoundError"


async def test_view_over_http(client: Client) -> None:
    sid = (await create_session(client))["id"]
    await settled_turn(client, sid, "#text done")
    info = (await (await client.get(f"/api/session/{sid}")).json())["data"]
    idle = info["time"]["idle"]
    assert "viewed" not in info["time"]
    assert (await client.post(f"/api/session/{sid}/view", json={"idle": idle})).status == 204
    info = (await (await client.get(f"/api/session/{sid}")).json())["data"]
    assert info["time"]["viewed"] == idle
    assert (await client.post(f"/api/session/{sid}/view", json={})).status == 400
    assert (await client.post(f"/api/session/{sid}/view", json={"idle": -5})).status == 400
    assert (await client.post("/api/session/ses_nope/view", json={"idle": 1})).status == 404


async def test_generate_over_http_leaves_the_log_alone(client: Client) -> None:
    sid = (await create_session(client))["id"]
    await settled_turn(client, sid, "#text done")
    store = runtime_of(client).store
    before = await store.read_all(limit=10_000)
    response = await client.post(f"/api/session/{sid}/generate", json={"prompt": "#text a summary"})
    assert response.status == 200
    assert await response.json() == {"data": {"text": "a summary"}}
    assert await store.read_all(limit=10_000) == before
    failing = await client.post(f"/api/session/{sid}/generate", json={"prompt": "#fail auth"})
    assert failing.status == 503
    assert (await failing.json())["_tag"] == "ServiceUnavailableError"
    assert (await client.post(f"/api/session/{sid}/generate", json={})).status == 400
    assert await store.read_all(limit=10_000) == before


async def test_export_import_and_stats_over_http(client: Client) -> None:
    sid = (await create_session(client, title="exported"))["id"]
    # The output ("sessionrt-output") appears nowhere in the call's input.
    command = "echo c2Vzc2lvbnJ0LW91dHB1dAo= | base64 -d"
    await settled_turn(client, sid, f'#tool bash {{"command": "{command}"}}\n#step\n#text ok')
    exported = await client.get(f"/api/experimental/session/{sid}/export")
    assert exported.status == 200
    document = await exported.json()
    assert set(document) == {"info", "messages"}
    assert document["info"]["id"] == sid
    assert "sessionrt-output" in str(document["messages"])

    clean = await client.get(f"/api/experimental/session/{sid}/export?sanitize=true")
    sanitized = await clean.json()
    assert "sessionrt-output" not in str(sanitized["messages"])
    assert len(sanitized["messages"]) == len(document["messages"])

    conflict = await client.post("/api/experimental/session/import", json=document)
    assert conflict.status == 409
    assert (await conflict.json())["_tag"] == "ConflictError"
    document["info"]["id"] = "ses_imported_over_http"
    imported = await client.post("/api/experimental/session/import", json=document)
    assert imported.status == 200, await imported.text()
    assert (await imported.json())["data"]["id"] == "ses_imported_over_http"
    again = await client.get("/api/experimental/session/ses_imported_over_http/export")
    copy = await again.json()
    assert [m["type"] for m in copy["messages"]] == [m["type"] for m in document["messages"]]
    assert copy["info"]["cost"] == document["info"]["cost"]

    garbage = await client.post("/api/experimental/session/import", json={"info": 1})
    assert garbage.status == 400
    missing = await client.get("/api/experimental/session/ses_nope/export")
    assert missing.status == 404

    stats = await client.get("/api/experimental/session/stats")
    assert stats.status == 200
    data = (await stats.json())["data"]
    assert data["sessions"] == 2
    assert data["models"][0]["model"]["providerID"] == "scripted"
    assert data["models"][0]["sessions"] == 2


async def test_move_over_http(client: Client, tmp_path: Path) -> None:
    sid = (await create_session(client))["id"]
    dest = tmp_path / "dest"
    dest.mkdir()
    (tmp_path / "plain-file").write_text("x")
    for directory, why in [
        (str(tmp_path / "missing"), "does not exist"),
        (str(tmp_path / "plain-file"), "is not a directory"),
        (str(runtime_of(client).config.data_dir), "data directory"),
    ]:
        refused = await client.post(f"/api/session/{sid}/move", json={"directory": directory})
        assert refused.status == 400
        body = await refused.json()
        assert (body["_tag"], body["field"]) == ("InvalidRequestError", "directory")
        assert why in body["message"]
    for bad in ({}, {"directory": 3}, {"directory": str(dest), "delivery": "later"}):
        response = await client.post(f"/api/session/{sid}/move", json=bad)
        assert response.status == 400, bad
    inbox = await client.get(f"/api/session/{sid}/inbox")
    assert (await inbox.json())["data"] == []

    moved = await client.post(
        f"/api/session/{sid}/move", json={"directory": str(dest), "delivery": "queue"}
    )
    assert moved.status == 204
    assert (await client.post(f"/api/experimental/session/{sid}/wait")).status == 204
    info = (await (await client.get(f"/api/session/{sid}")).json())["data"]
    assert info["location"] == {"directory": str(dest)}
    log = await runtime_of(client).store.read(sid)
    assert [r.type for r in log][-3:] == [
        "session.inbox.delivered.1",
        "session.moved.1",
        "session.execution.succeeded.1",
    ]
    gone = await client.post("/api/session/ses_nope/move", json={"directory": str(dest)})
    assert (gone.status, (await gone.json())["_tag"]) == (404, "SessionNotFoundError")
