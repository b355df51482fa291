"""Session movement through a real runtime: the move control item, its delivery, placement.

Real SQLite file, scripted model, real bash: where a tool call ran is what
``pwd`` printed in it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from feed import Feed
from pgdb import stored_and_rebuilt

from actors.runtime import Runtime
from protocol import codec
from protocol.errors import ConflictError, InvalidRequestError, SessionNotFoundError
from protocol.requests import CreateSessionInput, PromptInput
from protocol.shapes import Location, SystemMessage


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    path = tmp_path / "elsewhere"
    path.mkdir()
    return path


def bash(command: str) -> str:
    return "#tool bash " + json.dumps({"command": command, "timeout_s": 60})


def durable(feed: Feed, session_id: str) -> list[dict[str, Any]]:
    return [m for m in feed.events if m["data"].get("sessionID") == session_id and m.get("durable")]


async def tool_outputs(rt: Runtime, session_id: str) -> list[str]:
    page = await rt.sessions.messages(session_id, order="asc", limit=200)
    outputs = []
    for message in page.data:
        for part in codec.to_json(message).get("parts") or ():
            if part.get("type") == "tool":
                assert part["status"] == "completed", part
                text = "".join(c.get("text", "") for c in part.get("content") or ())
                outputs.append(text.strip())
    return outputs


async def replay_matches(rt: Runtime) -> None:
    stored, rebuilt = await stored_and_rebuilt(rt.store)
    assert stored == rebuilt


async def test_a_move_while_running_lands_at_the_next_step_boundary(
    runtime: Runtime, feed: Feed, workdir: Path, elsewhere: Path
) -> None:
    s = await runtime.sessions.create()
    script = f"{bash('sleep 0.5; pwd')}\n#step\n{bash('pwd')}\n#step\n#text done"
    await runtime.sessions.prompt(s.id, PromptInput(text=script))
    await feed.wait("session.tool.called", sessionID=s.id)
    item = await runtime.sessions.move(s.id, str(elsewhere))
    assert item.type == "move"
    assert item.payload == {"location": {"directory": str(elsewhere)}}
    assert [i.id for i in await runtime.sessions.pending(s.id)] == [item.id]
    # The running step is not interrupted: the session has not moved yet.
    assert (await runtime.sessions.get(s.id)).location.directory == str(workdir)
    await runtime.execution.wait_idle(s.id)

    assert (await runtime.sessions.get(s.id)).location == Location(directory=str(elsewhere))
    # The first call ran at home; the continuation after the move at the destination.
    assert await tool_outputs(runtime, s.id) == [str(workdir), str(elsewhere)]
    events = durable(feed, s.id)
    types = [e["type"] for e in events]
    moved = types.index("session.moved")
    assert types[moved - 1] == "session.inbox.delivered"
    assert events[moved - 1]["data"]["inboxID"] == item.id
    assert events[moved]["data"] == {"sessionID": s.id, "location": {"directory": str(elsewhere)}}
    # Between the first step's end and the continuation's start, in one command.
    assert (
        types.index("session.step.ended")
        < moved
        < len(types) - 1 - types[::-1].index("session.step.started")
    )
    assert types.count("session.execution.started") == 1  # the same execution goes on
    # Consumed without a transcript message of its own; the destination's
    # environment (its directory) arrives as an update before the next step.
    page = await runtime.sessions.messages(s.id, order="asc", limit=200)
    assert [m.type for m in page.data] == ["user", "assistant", "system", "assistant", "assistant"]
    system = page.data[2]
    assert isinstance(system, SystemMessage)
    assert "builtin/environment" in system.keys
    assert str(elsewhere) in system.text
    assert await runtime.sessions.pending(s.id) == []
    await replay_matches(runtime)


async def test_a_steer_admitted_after_a_pending_move_is_delivered_after_it(
    runtime: Runtime, feed: Feed, elsewhere: Path
) -> None:
    s = await runtime.sessions.create()
    await runtime.sessions.prompt(s.id, PromptInput(text=f"{bash('sleep 0.5')}\n#step\n#text a"))
    await feed.wait("session.tool.called", sessionID=s.id)
    move = await runtime.sessions.move(s.id, str(elsewhere))
    steer = await runtime.sessions.prompt(s.id, PromptInput(text=bash("pwd")))
    await runtime.execution.wait_idle(s.id)
    await runtime.execution.wait_idle(s.id)

    events = durable(feed, s.id)
    delivered = [e["data"]["inboxID"] for e in events if e["type"] == "session.inbox.delivered"]
    assert delivered[-2:] == [move.id, steer.id]
    types = [e["type"] for e in events]
    assert types.index("session.moved") < len(types) - 1 - types[::-1].index(
        "session.inbox.delivered"
    )
    # The steer ran where the session had moved to.
    assert (await tool_outputs(runtime, s.id))[-1] == str(elsewhere)


async def test_a_queued_move_waits_for_the_idle_boundary(
    runtime: Runtime, feed: Feed, workdir: Path, elsewhere: Path
) -> None:
    s = await runtime.sessions.create()
    script = f"{bash('sleep 0.3; pwd')}\n#step\n{bash('pwd')}\n#step\n#text a"
    await runtime.sessions.prompt(s.id, PromptInput(text=script))
    await feed.wait("session.tool.called", sessionID=s.id)
    await runtime.sessions.move(s.id, str(elsewhere), "queue")
    await runtime.execution.wait_idle(s.id)
    await runtime.execution.wait_idle(s.id)
    # The whole turn ran at home; the move landed once it was idle.
    assert await tool_outputs(runtime, s.id) == [str(workdir), str(workdir)]
    assert (await runtime.sessions.get(s.id)).location.directory == str(elsewhere)
    types = [e["type"] for e in durable(feed, s.id)]
    assert types[-3:] == ["session.inbox.delivered", "session.moved", "session.execution.succeeded"]
    assert await runtime.sessions.pending(s.id) == []


async def test_a_move_of_an_idle_session_is_delivered_at_once(
    runtime: Runtime, feed: Feed, elsewhere: Path
) -> None:
    s = await runtime.sessions.create()
    await runtime.sessions.move(s.id, str(elsewhere))
    await feed.wait("session.moved", sessionID=s.id)
    await runtime.execution.wait_idle(s.id)
    assert (await runtime.sessions.get(s.id)).location.directory == str(elsewhere)
    await runtime.sessions.prompt(s.id, PromptInput(text=bash("pwd")))
    await runtime.execution.wait_idle(s.id)
    assert await tool_outputs(runtime, s.id) == [str(elsewhere)]


async def test_move_refusals_admit_nothing(
    runtime: Runtime, tmp_path: Path, workdir: Path, elsewhere: Path
) -> None:
    s = await runtime.sessions.create()
    (tmp_path / "a-file").write_text("x")
    refused = {
        str(tmp_path / "missing"): "does not exist",
        str(tmp_path / "a-file"): "is not a directory",
        "relative/path": "absolute",
        str(runtime.config.data_dir): "data directory",
        str(runtime.config.data_dir / "inside"): "does not exist",
    }
    (runtime.config.data_dir / "sub").mkdir()
    refused[str(runtime.config.data_dir / "sub")] = "data directory"
    for directory, why in refused.items():
        with pytest.raises(InvalidRequestError, match=why) as error:
            await runtime.sessions.move(s.id, directory)
        assert error.value.fields.get("field") == "directory"
    assert await runtime.sessions.pending(s.id) == []
    assert (await runtime.sessions.get(s.id)).location.directory == str(workdir)
    with pytest.raises(SessionNotFoundError):
        await runtime.sessions.move("ses_nothere", str(elsewhere))


async def test_one_pending_move_per_session(
    runtime: Runtime, tmp_path: Path, elsewhere: Path
) -> None:
    s = await runtime.sessions.create()
    await runtime.sessions.prompt(s.id, PromptInput(text="#text x", resume=False))
    # Nothing runs (resume false on the prompt; the move is queued behind it and
    # an idle boundary delivers the prompt first), so the move stays pending.
    await runtime.sessions.inbox.move(
        s.id, Location(directory=str(elsewhere)), "queue", resume=False
    )
    [prompt, first] = await runtime.sessions.pending(s.id)
    again = await runtime.sessions.inbox.move(
        s.id, Location(directory=str(elsewhere)), "steer", resume=False
    )
    assert again == first  # the same destination: the pending item back
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(ConflictError, match="already pending"):
        await runtime.sessions.move(s.id, str(other))
    assert [i.id for i in await runtime.sessions.pending(s.id)] == [prompt.id, first.id]
    # Cancelled, the other destination may be requested.
    await runtime.sessions.cancel(s.id, first.id)
    await runtime.sessions.move(s.id, str(other))
    await runtime.execution.wait_idle(s.id)
    await runtime.execution.wait_idle(s.id)
    assert (await runtime.sessions.get(s.id)).location.directory == str(other)
    await replay_matches(runtime)


async def test_a_moved_session_forks_at_its_new_location(
    runtime: Runtime, feed: Feed, elsewhere: Path
) -> None:
    s = await runtime.sessions.create(CreateSessionInput(title="moving"))
    await runtime.sessions.move(s.id, str(elsewhere))
    await feed.wait("session.moved", sessionID=s.id)
    await runtime.execution.wait_idle(s.id)
    child = await runtime.sessions.fork(s.id)
    assert child.location.directory == str(elsewhere)
    await replay_matches(runtime)
