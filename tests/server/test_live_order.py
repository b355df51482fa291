"""On /api/event a part's live deltas never come before the part's started event."""

from __future__ import annotations

from typing import Any

from http_helpers import Client, create_session, frames, runtime_of

from protocol.requests import PromptInput

_STARTED = {
    "session.text.started": "session.text.delta",
    "session.reasoning.started": "session.reasoning.delta",
    "session.tool.input.started": "session.tool.input.delta",
}


def _part(event: str, data: dict[str, Any]) -> tuple[str, str, Any]:
    kind = event.rsplit(".", 1)[0].replace("session.", "")
    return kind, data["assistantMessageID"], data.get("ordinal", data.get("id"))


async def test_deltas_follow_their_step_and_part_started_events(client: Client) -> None:
    response = await client.get("/api/event")
    stream = frames(response)
    assert (await anext(stream))["event"] == "server.connected"
    sid = (await create_session(client))["id"]
    rt = runtime_of(client)
    await rt.sessions.prompt(sid, PromptInput(text="hello there, a reply in pieces"))
    steps: set[str] = set()
    parts: set[tuple[str, str, Any]] = set()
    deltas = 0
    succeeded = 0
    async for f in stream:
        event, envelope = f.get("event"), f.get("data")
        data = envelope.get("data") if isinstance(envelope, dict) else None
        if not isinstance(data, dict) or data.get("sessionID") != sid:
            continue
        if event == "session.step.started":
            steps.add(data["assistantMessageID"])
        elif event in _STARTED:
            parts.add(_part(_STARTED[event], data))
        elif event in _STARTED.values():
            deltas += 1
            assert data["assistantMessageID"] in steps, f"{event} before its step.started"
            assert _part(event, data) in parts, f"{event} before its part started"
        elif event == "session.execution.succeeded":
            succeeded += 1
            if succeeded == 1:
                await rt.sessions.prompt(sid, PromptInput(text='#tool bash {"command": "echo hi"}'))
            else:
                break
    response.close()
    assert deltas > 0
