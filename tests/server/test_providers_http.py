"""Real models end to end: a TOML config, the HTTP server, the runtime, a fake provider.

The config file has the exact documented shape; the fake provider (a real
loopback server, tests/llm/fake_providers.py) speaks the OpenAI and Anthropic
wire formats and records what it received, so these tests see both sides:
the durable log a client reads and the requests the model was sent.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from http_helpers import Client, create_session, runtime_of
from llm.fake_providers import (
    FakeProvider,
    Reply,
    anthropic_events,
    anthropic_text,
    openai_chunks,
    openai_error,
    openai_text,
    openai_tool_calls,
)

from server.app import ServerSettings, make_app
from server.config import load_config, runtime_config

KEY = "sk-local-0123456789abcdefSECRET"
ANTHROPIC_KEY = "sk-ant-0123456789abcdefSECRET"
LOCAL = {"providerID": "local", "id": "fake-model"}
CLAUDE = {"providerID": "claude", "id": "fake-claude"}


@pytest.fixture
async def fake() -> AsyncIterator[FakeProvider]:
    async with FakeProvider() as server:
        yield server


def write_config(path: Path, fake: FakeProvider, *, default_model: str | None = None) -> Path:
    runtime = f'default_model = "{default_model}"\n' if default_model else ""
    path.write_text(
        f"""
[providers.local]
kind = "openai"
base_url = "{fake.openai_url}"
api_key_env = "LOCAL_API_KEY"
headers = {{ "x-extra" = "1" }}

[providers.local.models.fake-model]
context = 128000
output = 4096

[providers.claude]
kind = "anthropic"
base_url = "{fake.anthropic_url}"
api_key_env = "CLAUDE_API_KEY"

[providers.claude.models.fake-claude]
context = 200000
output = 8192

[runtime]
{runtime}""",
        encoding="utf-8",
    )
    return path


MakeClient = Callable[..., Awaitable[Client]]


@pytest.fixture
def make_client(
    aiohttp_client: Callable[..., Awaitable[Client]],
    tmp_path: Path,
    fake: FakeProvider,
    monkeypatch: pytest.MonkeyPatch,
) -> MakeClient:
    monkeypatch.setenv("LOCAL_API_KEY", KEY)
    monkeypatch.setenv("CLAUDE_API_KEY", ANTHROPIC_KEY)

    async def make(default_model: str | None = None) -> Client:
        workdir = tmp_path / "project"
        workdir.mkdir(exist_ok=True)
        loaded = load_config(
            write_config(tmp_path / "sessionrt.toml", fake, default_model=default_model)
        )
        config = runtime_config(
            loaded, tmp_path / "data", fallback_data_dir=tmp_path, default_directory=str(workdir)
        )
        return await aiohttp_client(make_app(config=config, settings=ServerSettings()))

    return make


@pytest.fixture
async def client(make_client: MakeClient) -> Client:
    return await make_client()


async def run_prompt(client: Client, sid: str, text: str) -> list[dict[str, Any]]:
    response = await client.post(f"/api/session/{sid}/prompt", json={"text": text})
    assert response.status == 200, await response.text()
    response = await client.post(f"/api/experimental/session/{sid}/wait")
    assert response.status == 204, await response.text()
    return await log(client, sid)


async def log(client: Client, sid: str) -> list[dict[str, Any]]:
    response = await client.get(f"/api/experimental/session/{sid}/log")
    events = []
    for frame in (await response.text()).split("\n\n"):
        for line in frame.splitlines():
            if line.startswith("data: "):
                events.append(orjson.loads(line[6:]))
    return [e for e in events if e["type"] != "log.synced"]


def of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == kind]


async def test_a_plain_answer_through_each_format(client: Client, fake: FakeProvider) -> None:
    for model, frames in ((LOCAL, openai_text(["Hel", "lo"])), (CLAUDE, anthropic_text(["Hi!"]))):
        fake.replies.append(Reply.stream(frames))
        sid = (await create_session(client, model=model))["id"]
        events = await run_prompt(client, sid, "hello")
        assert of(events, "session.execution.succeeded")
        texts = [d["text"] for d in of(events, "session.text.ended")]
        assert texts == (["Hello"] if model is LOCAL else ["Hi!"])
        started = of(events, "session.step.started")
        assert started[0]["model"] == model
    assert fake.received[0].body["messages"][-1] == {"role": "user", "content": "hello"}
    assert fake.received[0].headers["x-extra"] == "1"
    assert fake.received[1].body["messages"][-1] == {
        "role": "user",
        "content": [{"type": "text", "text": "hello"}],
    }


async def test_parallel_tool_calls_run_and_their_results_go_back(
    client: Client, fake: FakeProvider
) -> None:
    fake.replies.append(
        Reply.stream(
            openai_tool_calls(
                [
                    ("call_1", "bash", ['{"command": "echo one"}']),
                    ("call_2", "bash", ['{"command":', ' "echo two"}']),
                ]
            )
        )
    )
    fake.replies.append(Reply.stream(openai_text(["Both ran."])))
    sid = (await create_session(client, model=LOCAL))["id"]
    events = await run_prompt(client, sid, "run two")

    assert of(events, "session.execution.succeeded")
    assert [d["id"] for d in of(events, "session.tool.called")] == ["call_1", "call_2"]
    system, *second = fake.received[1].body["messages"]
    assert system["role"] == "system"
    assert "build agent" in system["content"]  # the agent's system prompt
    assert second[0] == {"role": "user", "content": "run two"}
    assert second[1]["role"] == "assistant"
    assert [c["id"] for c in second[1]["tool_calls"]] == ["call_1", "call_2"]
    results = second[2:4]
    assert [r["role"] for r in results] == ["tool", "tool"]
    assert [r["tool_call_id"] for r in results] == ["call_1", "call_2"]
    assert "one" in results[0]["content"]
    assert "two" in results[1]["content"]
    assert any(t["function"]["name"] == "bash" for t in fake.received[0].body["tools"])


async def test_a_tool_loop_on_anthropic_sends_results_in_the_next_user_message(
    client: Client, fake: FakeProvider
) -> None:
    fake.replies.append(
        Reply.stream(
            anthropic_events(
                [
                    (
                        {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {}},
                        [{"type": "input_json_delta", "partial_json": '{"command": "echo hi"}'}],
                    )
                ],
                stop_reason="tool_use",
            )
        )
    )
    fake.replies.append(Reply.stream(anthropic_text(["done"])))
    sid = (await create_session(client, model=CLAUDE))["id"]
    events = await run_prompt(client, sid, "go")
    assert of(events, "session.execution.succeeded")
    assert "build agent" in fake.received[1].body["system"]
    second = fake.received[1].body["messages"]
    assert [m["role"] for m in second] == ["user", "assistant", "user"]
    result = second[2]["content"][0]
    assert result["type"] == "tool_result"
    assert result["tool_use_id"] == "toolu_1"
    assert "hi" in result["content"]


async def test_reasoning_is_recorded(client: Client, fake: FakeProvider) -> None:
    fake.replies.append(
        Reply.stream(openai_chunks([{"reasoning_content": "mull"}, {"content": "ok"}]))
    )
    sid = (await create_session(client, model=LOCAL))["id"]
    events = await run_prompt(client, sid, "q")
    assert [d["text"] for d in of(events, "session.reasoning.ended")] == ["mull"]
    assert [d["text"] for d in of(events, "session.text.ended")] == ["ok"]


async def test_the_default_model_comes_from_the_config(
    make_client: MakeClient, fake: FakeProvider
) -> None:
    client = await make_client(default_model="local/fake-model")
    fake.replies.append(Reply.stream(openai_text(["from default"])))
    sid = (await create_session(client))["id"]
    events = await run_prompt(client, sid, "hi")
    assert [d["text"] for d in of(events, "session.text.ended")] == ["from default"]
    assert of(events, "session.step.started")[0]["model"] == LOCAL


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"providerID": "nowhere", "id": "m"}, "unknown provider 'nowhere'"),
        ({"providerID": "local", "id": "nope"}, "provider 'local' has no model 'nope'"),
    ],
)
async def test_an_unknown_provider_or_model_is_a_400_when_chosen(
    client: Client, model: dict[str, str], message: str
) -> None:
    response = await client.post("/api/session", json={"model": model})
    assert response.status == 400
    body = await response.json()
    assert body["_tag"] == "InvalidRequestError"
    assert body["field"] == "model"
    assert body["message"] == message

    sid = (await create_session(client))["id"]
    response = await client.post(f"/api/session/{sid}/model", json={"model": model})
    assert response.status == 400
    assert (await response.json())["message"] == message
    response = await client.post(f"/api/session/{sid}/model", json={"model": LOCAL})
    assert response.status == 204


async def test_a_provider_failure_fails_the_execution_without_leaking_the_key(
    client: Client, fake: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    fake.replies.append(
        openai_error(401, f"Incorrect API key provided: {KEY[:6]}***{KEY[-4:]}", type="auth")
    )
    sid = (await create_session(client, model=LOCAL))["id"]
    events = await run_prompt(client, sid, "hi")
    failed = of(events, "session.execution.failed")
    assert failed[0]["error"]["type"] == "provider.authentication"
    everything = orjson.dumps(events).decode() + caplog.text
    assert "Incorrect API key provided" in everything
    for secret in (KEY, KEY[:6], KEY[-4:], fake.root):
        assert secret not in everything


async def test_a_missing_key_variable_is_named_at_start_and_at_use(
    client: Client, fake: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CLAUDE_API_KEY")
    sid = (await create_session(client, model=CLAUDE))["id"]
    events = await run_prompt(client, sid, "hi")
    error = of(events, "session.execution.failed")[0]["error"]
    assert error["type"] == "provider.authentication"
    assert "CLAUDE_API_KEY" in error["message"]
    assert fake.received == []


async def test_a_server_starting_without_the_key_warns_naming_the_variable(
    make_client: MakeClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("LOCAL_API_KEY")
    caplog.set_level(logging.WARNING)
    client = await make_client()
    assert "LOCAL_API_KEY" in caplog.text
    assert runtime_of(client).services.adapters.keys() == {"local", "claude"}


async def test_the_model_list_names_the_configured_models_and_no_key(client: Client) -> None:
    response = await client.get("/api/model")
    assert response.status == 200
    text = await response.text()
    assert (await response.json())["data"] == [
        CLAUDE,
        LOCAL,
        {"providerID": "scripted", "id": "scripted"},
    ]
    # Nothing of the provider's configuration beyond the names: no key, no address.
    for secret in (KEY, ANTHROPIC_KEY, "LOCAL_API_KEY", "127.0.0.1", "x-extra"):
        assert secret not in text
    # What it lists can be chosen.
    sid = (await create_session(client))["id"]
    for model in (await response.json())["data"]:
        chosen = await client.post(f"/api/session/{sid}/model", json={"model": model})
        assert chosen.status == 204, await chosen.text()
