"""``sessionrt run --config FILE --model PROVIDER/MODEL`` against a fake provider (through
``main`` in-process), and ``sessionrt serve --config FILE`` (a real process)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from cli_inprocess import sessionrt
from llm.fake_providers import FakeProvider, Reply, anthropic_text, openai_text

EXE = str(Path(sys.executable).with_name("sessionrt"))
KEY = "sk-cli-0123456789abcdefSECRET"


@pytest.fixture
async def fake() -> AsyncIterator[FakeProvider]:
    async with FakeProvider() as server:
        yield server


async def test_run_with_a_configured_model(tmp_path: Path, fake: FakeProvider) -> None:
    config = tmp_path / "sessionrt.toml"
    config.write_text(
        f'[providers.local]\nkind = "openai"\nbase_url = "{fake.openai_url}"\n'
        'api_key_env = "LOCAL_API_KEY"\n\n'
        "[providers.local.models.fake-model]\ncontext = 128000\noutput = 4096\n"
    )
    fake.replies.append(Reply.stream(openai_text(["Hello ", "from the fake."])))
    env = {**os.environ, "LOCAL_API_KEY": KEY}
    args = ("--config", str(config), "--data-dir", str(tmp_path / "data"))

    # Through main in-process (tests/cli_inprocess.py); serving, below, is a real process.
    done = await sessionrt("run", "hi", "--model", "local/fake-model", *args, env=env)

    assert done.code == 0, done.err
    assert done.out == "Hello from the fake.\n"
    assert fake.received[0].headers["Authorization"] == f"Bearer {KEY}"
    assert fake.received[0].body["model"] == "fake-model"
    assert KEY not in done.out + done.err

    done = await sessionrt("run", "hi", "--model", "local/other", *args, env=env)
    assert done.code == 1
    assert done.err == "sessionrt: InvalidRequestError: provider 'local' has no model 'other'\n"


async def test_serve_with_providers_from_the_config(tmp_path: Path, fake: FakeProvider) -> None:
    config = tmp_path / "sessionrt.toml"
    config.write_text(
        f'[providers.claude]\nkind = "anthropic"\nbase_url = "{fake.anthropic_url}"\n'
        'api_key_env = "CLAUDE_API_KEY"\n\n'
        "[providers.claude.models.fake-claude]\ncontext = 200000\noutput = 8192\n\n"
        '[runtime]\ndefault_model = "claude/fake-claude"\n'
    )
    fake.replies.append(Reply.stream(anthropic_text(["Served."])))
    env = {**os.environ, "CLAUDE_API_KEY": KEY}
    env.pop("SESSIONRT_SERVER_PASSWORD", None)
    proc = await asyncio.create_subprocess_exec(
        EXE, "serve", "--config", str(config), "--port", "0", "--data-dir", str(tmp_path / "d"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        url = re.search(r"http://\S+", line)
        assert url, line
        base = url.group(0)
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{base}/api/session", json={}) as response:
                sid = (await response.json())["data"]["id"]
            async with http.post(f"{base}/api/session/{sid}/prompt", json={"text": "hi"}):
                pass
            async with http.post(f"{base}/api/experimental/session/{sid}/wait") as response:
                assert response.status == 204
            async with http.get(f"{base}/api/experimental/session/{sid}/log") as response:
                log = await response.text()
            bad = {"model": {"providerID": "claude", "id": "nope"}}
            async with http.post(f"{base}/api/session", json=bad) as response:
                assert response.status == 400
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0
    assert '"text":"Served."' in log.replace(" ", "")
    assert "session.execution.succeeded" in log
    assert fake.received[0].headers["x-api-key"] == KEY
    assert KEY not in log + err.decode()
