"""``GET /api/session/{id}/diff?messageID=<assistant message>``: one step's files, over HTTP.

Real git work trees, a real server on loopback, the scripted model making the
steps. The step's diff comes from its own snapshots (``before`` and
``snapshot`` of its ``step.ended``), only its ``files``; the message is looked
up in the asked session only.
"""

from __future__ import annotations

import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from http_helpers import Client, assert_guarded, tagged

from tests.shell.conftest import tool

MakeClient = Callable[..., Awaitable[Client]]
AUTH = {"Authorization": "Bearer hunter2"}


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def make_repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q")
    (path / "a.txt").write_text("alpha\n")
    (path / "keep.txt").write_text("untouched\n")
    git(path, "add", "-A")
    git(path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    return path


async def _session(client: Client, directory: Path) -> str:
    response = await client.post(
        "/api/session", json={"location": {"directory": str(directory)}}, headers=AUTH
    )
    assert response.status == 200, await response.text()
    sid: str = (await response.json())["data"]["id"]
    return sid


async def _run(client: Client, sid: str, text: str) -> list[dict[str, Any]]:
    """Prompt ``text``, wait until the session is idle; its messages, oldest first."""
    response = await client.post(f"/api/session/{sid}/prompt", json={"text": text}, headers=AUTH)
    assert response.status == 200, await response.text()
    response = await client.post(f"/api/experimental/session/{sid}/wait", headers=AUTH)
    assert response.status == 204, await response.text()
    page = await client.get(f"/api/session/{sid}/message?order=asc&limit=200", headers=AUTH)
    messages: list[dict[str, Any]] = (await page.json())["data"]
    return messages


async def _diff(client: Client, sid: str, query: str) -> Any:
    response = await client.get(f"/api/session/{sid}/diff?{query}", headers=AUTH)
    return response.status, await response.json()


TWO_STEPS = "\n".join(
    [
        tool("write", path="a.txt", content="ALPHA\n"),
        "---",
        tool("write", path="b/new.txt", content="bravo\n"),
        "---",
        "#text done",
    ]
)


async def test_each_step_answers_only_the_files_it_changed(
    make_client: MakeClient, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "project")
    client = await make_client(password="hunter2")
    sid = await _session(client, repo)
    messages = await _run(client, sid, TWO_STEPS)
    user = [m for m in messages if m["type"] == "user"]
    steps = [m for m in messages if m["type"] == "assistant"]
    assert len(user) == 1
    assert len(steps) == 3
    # The user changes a file after the steps: no step claims it.
    (repo / "keep.txt").write_text("the user's own edit\n")
    status, first = await _diff(client, sid, f"messageID={steps[0]['id']}")
    assert status == 200
    assert [(d["file"], d["status"]) for d in first["data"]] == [("a.txt", "modified")]
    assert "-alpha" in first["data"][0]["patch"]
    assert "+ALPHA" in first["data"][0]["patch"]
    status, second = await _diff(client, sid, f"messageID={steps[1]['id']}")
    assert status == 200
    assert [(d["file"], d["status"], d["additions"]) for d in second["data"]] == [
        ("b/new.txt", "added", 1)
    ]
    # The answering step ran no writing tool: it changed nothing.
    assert await _diff(client, sid, f"messageID={steps[2]['id']}") == (200, {"data": []})
    # context applies as for the prompt diff.
    status, zero = await _diff(client, sid, f"messageID={steps[0]['id']}&context=0")
    assert zero["data"][0]["patch"].count("@@") == 2
    # The prompt's diff (between user messages) still has both steps' files.
    status, prompt = await _diff(client, sid, f"from={user[0]['id']}")
    assert status == 200
    assert {d["file"] for d in prompt["data"]} == {"a.txt", "b/new.txt", "keep.txt"}


async def test_a_step_is_asked_by_its_assistant_message_in_its_own_session_only(
    make_client: MakeClient, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "project")
    client = await make_client(password="hunter2")
    mine, other = await _session(client, repo), await _session(client, repo)
    messages = await _run(client, mine, TWO_STEPS)
    others = await _run(client, other, tool("write", path="secret.txt", content="s3cret\n"))
    step = next(m["id"] for m in messages if m["type"] == "assistant")
    user = next(m["id"] for m in messages if m["type"] == "user")
    foreign = next(m["id"] for m in others if m["type"] == "assistant")
    # Another session's step (same directory, same snapshot store): not found, nothing read.
    status, body = await _diff(client, mine, f"messageID={foreign}")
    assert (status, body["_tag"], body["messageID"]) == (404, "MessageNotFoundError", foreign)
    assert "s3cret" not in str(body)
    status, body = await _diff(client, other, f"messageID={step}")
    assert (status, body["_tag"]) == (404, "MessageNotFoundError")
    # A user message is no step: a tagged 400 naming the field.
    status, body = await _diff(client, mine, f"messageID={user}")
    assert (status, body["_tag"], body["field"]) == (400, "InvalidRequestError", "messageID")
    # Unknown, forged, huge ids; with from/to; an unknown session.
    assert await tagged(
        await client.get(f"/api/session/{mine}/diff?messageID=msg_nope", headers=AUTH)
    ) == (404, "MessageNotFoundError")
    for forged in ("nope", "ses_abc", "msg_../../etc/passwd", "msg_" + "a" * 4000, "-msg_x", ""):
        response = await client.get(
            f"/api/session/{mine}/diff", params={"messageID": forged}, headers=AUTH
        )
        assert await tagged(response) == (400, "InvalidRequestError"), forged
    response = await client.get(
        f"/api/session/{mine}/diff", params={"messageID": step, "from": user}, headers=AUTH
    )
    status, tag = await tagged(response)
    assert (status, tag) == (400, "InvalidRequestError")
    assert await tagged(
        await client.get(f"/api/session/ses_none/diff?messageID={step}", headers=AUTH)
    ) == (404, "SessionNotFoundError")


async def test_a_step_without_a_snapshot_changed_no_files(
    make_client: MakeClient, tmp_path: Path
) -> None:
    """Outside a git work tree a writing step records no snapshot: its diff is empty."""
    plain = tmp_path / "plain"
    plain.mkdir()
    client = await make_client(password="hunter2")
    sid = await _session(client, plain)
    messages = await _run(client, sid, tool("write", path="x.txt", content="x\n") + "\n---\n#text")
    assert (plain / "x.txt").read_text() == "x\n"
    for step in (m for m in messages if m["type"] == "assistant"):
        assert await _diff(client, sid, f"messageID={step['id']}") == (200, {"data": []})


async def test_a_step_diff_never_reads_outside_the_session_directory(
    make_client: MakeClient, tmp_path: Path
) -> None:
    """A symlink a step makes to a file outside shows as its target path, never the bytes."""
    secret = tmp_path / "outside" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("TOP-SECRET-CONTENT\n")
    repo = make_repo(tmp_path / "project")
    (repo / "a.txt").unlink()
    (repo / "a.txt").symlink_to(secret)  # the user's own link, before the step
    client = await make_client(password="hunter2")
    sid = await _session(client, repo)
    command = f"ln -s {secret} link && ln -sfn {secret.parent} dirlink && echo hi > plain.txt"
    messages = await _run(client, sid, tool("bash", command=command) + "\n---\n#text")
    step = next(m["id"] for m in messages if m["type"] == "assistant")
    status, body = await _diff(client, sid, f"messageID={step}")
    assert status == 200
    diffs = {d["file"]: d for d in body["data"]}
    assert set(diffs) == {"link", "dirlink", "plain.txt"}
    assert f"+{secret}" in diffs["link"]["patch"]
    assert "TOP-SECRET-CONTENT" not in str(body)
    # The prompt diff and the step diff agree: neither follows a link.
    user = next(m["id"] for m in messages if m["type"] == "user")
    status, prompt = await _diff(client, sid, f"from={user}")
    assert "TOP-SECRET-CONTENT" not in str(prompt)


async def test_the_step_diff_is_behind_the_guards(make_client: MakeClient, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "project")
    client = await make_client(password="hunter2")
    sid = await _session(client, repo)
    messages = await _run(client, sid, TWO_STEPS)
    step = next(m["id"] for m in messages if m["type"] == "assistant")
    url = f"/api/session/{sid}/diff?messageID={step}"
    await assert_guarded(client, url, AUTH)
    response = await client.get(url, headers=AUTH)
    assert response.status == 200
    assert [d["file"] for d in (await response.json())["data"]] == ["a.txt"]
