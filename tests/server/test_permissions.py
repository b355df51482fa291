"""Permission asks over HTTP: a real server, real bash subprocesses, real files.

A call whose rule says ``ask`` waits (``session.permission.asked`` durable,
nothing run) until ``POST /api/session/{id}/permission/{permissionID}``
answers it; the answers, their conflicts and their effects are checked on
the files the tools touch and on the durable log.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from http_helpers import Client, collect_until_synced, create_session

ASKER = """
[agents.asker.permissions]
bash = { "echo *" = "allow", "*" = "ask", "rm *" = "deny" }
"""


def _agents(tmp_path: Path, text: str) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700, exist_ok=True)
    (data / "agents.toml").write_text(text)


def _script(*lines: str) -> str:
    return "\n".join(lines)


def _bash(command: str) -> str:
    return "#tool bash " + json.dumps({"command": command})


async def _pending(client: Client, sid: str, count: int = 1) -> list[dict[str, Any]]:
    async with asyncio.timeout(30):  # a guard, never the assertion
        while True:
            response = await client.get(f"/api/session/{sid}/permission")
            assert response.status == 200, await response.text()
            data: list[dict[str, Any]] = (await response.json())["data"]
            if len(data) >= count:
                return data
            await asyncio.sleep(0.02)


async def _wait(client: Client, sid: str) -> None:
    response = await client.post(f"/api/experimental/session/{sid}/wait")
    assert response.status == 204, await response.text()


async def _log(client: Client, sid: str) -> list[dict[str, Any]]:
    response = await client.get(f"/api/experimental/session/{sid}/log")
    assert response.status == 200
    return [
        f["data"] for f in await collect_until_synced(response) if f.get("event") != "log.synced"
    ]


async def _reply(client: Client, sid: str, pid: str, reply: str) -> int:
    response = await client.post(f"/api/session/{sid}/permission/{pid}", json={"reply": reply})
    return response.status


async def _start(
    make_client: Callable[..., Awaitable[Client]], tmp_path: Path, text: str = ASKER
) -> tuple[Client, Path]:
    _agents(tmp_path, text)
    client = await make_client()
    return client, tmp_path / "project"


async def test_once_runs_the_call_after_the_answer_and_only_then(
    make_client: Callable[..., Awaitable[Client]], tmp_path: Path
) -> None:
    client, workdir = await _start(make_client, tmp_path)
    sid = (await create_session(client, agent="asker"))["id"]
    script = _script(_bash("echo hi && touch ran"), "#step", "#text done")
    assert (await client.post(f"/api/session/{sid}/prompt", json={"text": script})).status == 200
    [asked] = await _pending(client, sid)
    assert asked["tool"] == "bash"
    assert asked["permission"] == "bash"
    assert asked["patterns"] == ["touch ran"]  # echo is allowed, only touch is asked
    assert asked["summary"] == "echo hi && touch ran"
    assert asked["id"].startswith("per_")
    assert asked["callID"]
    assert not (workdir / "ran").exists()  # waiting: nothing ran (the log's order, below)

    assert await _reply(client, sid, asked["id"], "once") == 204
    await _wait(client, sid)
    assert (workdir / "ran").exists()
    assert await _reply(client, sid, asked["id"], "once") == 409  # already answered
    assert await _reply(client, sid, "per_00000000000000unknown", "once") == 404
    assert (await (await client.get(f"/api/session/{sid}/permission")).json()) == {"data": []}

    events = await _log(client, sid)
    types = [e["type"] for e in events]
    asked_at = types.index("session.permission.asked")
    replied_at = types.index("session.permission.replied")
    success_at = types.index("session.tool.success")
    assert types.index("session.tool.called") < asked_at < replied_at < success_at
    # The command's process started only after the answer: what "only then" means,
    # as a sequence in the log rather than a wait that nothing happens.
    assert replied_at < types.index("session.tool.spawned") < success_at
    assert events[replied_at]["data"] == {"sessionID": sid, "id": asked["id"], "reply": "once"}
    assert types[-1] == "session.execution.succeeded"


async def test_reject_fails_the_call_and_the_step_goes_on(
    make_client: Callable[..., Awaitable[Client]], tmp_path: Path
) -> None:
    client, workdir = await _start(make_client, tmp_path)
    sid = (await create_session(client, agent="asker"))["id"]
    script = _script(_bash("touch ran"), "#step", "#text carried on")
    await client.post(f"/api/session/{sid}/prompt", json={"text": script})
    [asked] = await _pending(client, sid)
    assert await _reply(client, sid, asked["id"], "reject") == 204
    await _wait(client, sid)
    assert not (workdir / "ran").exists()
    events = await _log(client, sid)
    [failed] = [e for e in events if e["type"] == "session.tool.failed"]
    assert failed["data"]["error"]["type"] == "permission.rejected"
    assert failed["data"]["executed"] is False
    texts = [e["data"]["text"] for e in events if e["type"] == "session.text.ended"]
    assert texts == ["carried on"]


async def test_always_records_a_session_rule_that_later_calls_use(
    make_client: Callable[..., Awaitable[Client]], tmp_path: Path
) -> None:
    client, workdir = await _start(make_client, tmp_path)
    sid = (await create_session(client, agent="asker"))["id"]
    script = _script(
        _bash("touch one"), "#step", _bash("touch one && touch two"), "#step", "#text done"
    )
    await client.post(f"/api/session/{sid}/prompt", json={"text": script})
    [first] = await _pending(client, sid)
    assert await _reply(client, sid, first["id"], "always") == 204
    # The second call's "touch one" is allowed by the rule; "touch two" still asks.
    async with asyncio.timeout(30):
        while True:
            pending = await _pending(client, sid)
            if pending[0]["id"] != first["id"]:
                break
            await asyncio.sleep(0.02)
    [second] = pending
    assert second["patterns"] == ["touch two"]
    assert await _reply(client, sid, second["id"], "once") == 204
    await _wait(client, sid)
    assert (workdir / "one").exists()
    assert (workdir / "two").exists()

    # A new session has no such rule: its own call asks again.
    other = (await create_session(client, agent="asker"))["id"]
    await client.post(f"/api/session/{other}/prompt", json={"text": _bash("touch one")})
    [again] = await _pending(client, other)
    assert again["patterns"] == ["touch one"]
    assert await _reply(client, other, again["id"], "reject") == 204
    await _wait(client, other)


async def test_a_denied_command_in_a_chain_denies_the_call(
    make_client: Callable[..., Awaitable[Client]], tmp_path: Path
) -> None:
    client, workdir = await _start(make_client, tmp_path)
    (workdir / "keep").write_text("x")
    sid = (await create_session(client, agent="asker"))["id"]
    script = _script(_bash("echo hi; rm keep"), "#step", "#text ok")
    await client.post(f"/api/session/{sid}/prompt", json={"text": script})
    await _wait(client, sid)
    assert (workdir / "keep").exists()
    events = await _log(client, sid)
    [failed] = [e for e in events if e["type"] == "session.tool.failed"]
    assert failed["data"]["error"]["type"] == "permission.denied"
    assert "session.permission.asked" not in [e["type"] for e in events]


async def test_an_interrupt_while_waiting_fails_the_call_unrun(
    make_client: Callable[..., Awaitable[Client]], tmp_path: Path
) -> None:
    client, workdir = await _start(make_client, tmp_path)
    sid = (await create_session(client, agent="asker"))["id"]
    await client.post(f"/api/session/{sid}/prompt", json={"text": _bash("touch ran")})
    [asked] = await _pending(client, sid)
    response = await client.post(f"/api/session/{sid}/interrupt")
    assert await response.json() == {"interrupted": True}
    await _wait(client, sid)
    assert await _reply(client, sid, asked["id"], "once") == 409  # expired with its call
    assert not (workdir / "ran").exists()
    events = await _log(client, sid)
    [failed] = [e for e in events if e["type"] == "session.tool.failed"]
    assert failed["data"]["error"]["type"] == "aborted"
    assert failed["data"]["executed"] is False
    assert (await (await client.get(f"/api/session/{sid}/permission")).json()) == {"data": []}


async def test_bad_replies_are_tagged_errors(
    make_client: Callable[..., Awaitable[Client]], tmp_path: Path
) -> None:
    client, _ = await _start(make_client, tmp_path)
    sid = (await create_session(client))["id"]
    url = f"/api/session/{sid}/permission/per_00000000000000unknown"
    response = await client.post(url, json={"reply": "maybe"})
    assert response.status == 400, await response.text()
    response = await client.post(url, json={"reply": "once"})
    assert response.status == 404
    assert (await response.json())["_tag"] == "PermissionNotFoundError"
    response = await client.get("/api/session/ses_00000000000000missing/permission")
    assert response.status == 404


async def test_external_directory_asks_by_default_and_rules_open_it(
    make_client: Callable[..., Awaitable[Client]], tmp_path: Path
) -> None:
    outside = tmp_path / "sibling"
    outside.mkdir()
    (outside / "secret.txt").write_text("outside text\n")
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "doc.txt").write_text("shared text\n")
    text = f"""
[agents.opener.permissions]
external_directory = {{ "{shared}/*" = "allow", "{outside}/*" = "deny" }}
"""
    client, workdir = await _start(make_client, tmp_path, text)
    (workdir / "link").symlink_to(outside / "secret.txt")

    def read(path: str) -> str:
        return "#tool read " + json.dumps({"path": path})

    # build: the default is ask (as in OpenCode), for a spelled path and a symlink alike.
    sid = (await create_session(client))["id"]
    await client.post(f"/api/session/{sid}/prompt", json={"text": read("link")})
    [asked] = await _pending(client, sid)
    assert asked["permission"] == "external_directory"
    assert asked["patterns"] == [str((outside / "secret.txt").resolve())]
    assert asked["always"] == [f"{outside.resolve()}/*"]
    assert await _reply(client, sid, asked["id"], "once") == 204
    await _wait(client, sid)
    events = await _log(client, sid)
    [done] = [e for e in events if e["type"] == "session.tool.success"]
    assert "outside text" in json.dumps(done["data"]["content"])

    # opener: allowed where its rule says, denied where it says so, even through a link.
    sid = (await create_session(client, agent="opener"))["id"]
    script = _script(read(str(shared / "doc.txt")), read("link"), "#step", "#text ok")
    await client.post(f"/api/session/{sid}/prompt", json={"text": script})
    await _wait(client, sid)
    events = await _log(client, sid)
    [done] = [e for e in events if e["type"] == "session.tool.success"]
    assert "shared text" in json.dumps(done["data"]["content"])
    [failed] = [e for e in events if e["type"] == "session.tool.failed"]
    assert failed["data"]["error"]["type"] == "permission.denied"
    assert "outside the session's directory" in failed["data"]["error"]["message"]
    assert "session.permission.asked" not in [e["type"] for e in events]


async def test_a_pending_ask_keeps_the_issuing_steps_agent_across_an_agent_switch(
    make_client: Callable[..., Awaitable[Client]], tmp_path: Path
) -> None:
    client, workdir = await _start(make_client, tmp_path)
    sid = (await create_session(client, agent="asker"))["id"]
    script = _script(_bash("touch ran"), "#step", "#text done")
    await client.post(f"/api/session/{sid}/prompt", json={"text": script})
    [asked] = await _pending(client, sid)
    # plan may not run bash at all; the waiting call keeps asker's policy.
    response = await client.post(f"/api/session/{sid}/agent", json={"agent": "plan"})
    assert response.status == 204, await response.text()
    assert [p["id"] for p in await _pending(client, sid)] == [asked["id"]]
    assert await _reply(client, sid, asked["id"], "once") == 204
    await _wait(client, sid)
    assert (workdir / "ran").exists()
    events = await _log(client, sid)
    assert [e["type"] for e in events].count("session.tool.success") == 1
    assert "session.tool.failed" not in [e["type"] for e in events]
