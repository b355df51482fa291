"""``GET /api/session/{id}/agent``: the agents a session may select, guarded, no secrets."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from http_helpers import Client, assert_guarded, tagged

MakeClient = Callable[..., Awaitable[Client]]
AUTH = {"Authorization": "Bearer hunter2"}

OPERATOR = """
[agents.reviewer]
mode = "subagent"
description = "Reviews a change"
system = "OPERATOR-SYSTEM-PROMPT"
script = "#text OPERATOR-SCRIPT"

[agents.build]
model = { id = "scripted", providerID = "scripted" }
"""

PROJECT = """
[agents.docs]
mode = "primary"
description = "Writes the docs"
system = "PROJECT-SYSTEM-PROMPT"

[agents.docs.permissions]
bash = "deny"
"""


async def test_a_session_lists_its_agents_behind_the_guards(
    make_client: MakeClient, tmp_path: Path
) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "agents.toml").write_text(OPERATOR)
    project = tmp_path / "project"
    (project / ".sessionrt").mkdir(parents=True)
    (project / ".sessionrt" / "agents.toml").write_text(PROJECT)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    client = await make_client(password="hunter2")
    created = await client.post(
        "/api/session", json={"location": {"directory": str(project)}}, headers=AUTH
    )
    sid = (await created.json())["data"]["id"]
    url = f"/api/session/{sid}/agent"
    await assert_guarded(client, url, AUTH)
    response = await client.get(url, headers=AUTH)
    assert response.status == 200
    text = await response.text()
    agents = {a["name"]: a for a in (await response.json())["data"]}
    assert list(agents) == ["build", "docs", "general", "plan", "reviewer"]
    assert agents["build"] == {
        "name": "build",
        "mode": "primary",
        "description": "",
        "model": {"id": "scripted", "providerID": "scripted"},
    }
    assert agents["docs"]["mode"] == "primary"
    assert agents["docs"]["description"] == "Writes the docs"
    assert agents["reviewer"]["mode"] == "subagent"
    assert agents["general"]["mode"] == "subagent"
    # System prompts, scripts and permissions stay on the server.
    for private in ("SYSTEM-PROMPT", "SCRIPT", "permissions", "deny", "system"):
        assert private not in text
    # Every agent listed is one the session may select.
    for name in agents:
        chosen = await client.post(url, json={"agent": name}, headers=AUTH)
        assert chosen.status == 204, await chosen.text()
    # Another directory's session has no project agents; the directory is the session's own.
    other = await client.post(
        "/api/session", json={"location": {"directory": str(elsewhere)}}, headers=AUTH
    )
    oid = (await other.json())["data"]["id"]
    response = await client.get(
        f"/api/session/{oid}/agent", params={"directory": str(project)}, headers=AUTH
    )
    assert [a["name"] for a in (await response.json())["data"]] == [
        "build",
        "general",
        "plan",
        "reviewer",
    ]
    assert await tagged(await client.get("/api/session/ses_none/agent", headers=AUTH)) == (
        404,
        "SessionNotFoundError",
    )
    assert await tagged(await client.get("/api/session/nope/agent", headers=AUTH)) == (
        400,
        "InvalidRequestError",
    )
