"""``sessionrt run --config FILE --model PROVIDER/MODEL`` against a fake provider."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from llm.fake_providers import FakeProvider, Reply, openai_text

EXE = str(Path(sys.executable).with_name("sessionrt"))
KEY = "sk-cli-0123456789abcdefSECRET"


@pytest.fixture
async def fake() -> AsyncIterator[FakeProvider]:
    async with FakeProvider() as server:
        yield server


async def sessionrt(*args: str, env: dict[str, str]) -> tuple[int | None, str, str]:
    proc = await asyncio.create_subprocess_exec(
        EXE, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, out.decode(), err.decode()


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

    code, out, err = await sessionrt("run", "hi", "--model", "local/fake-model", *args, env=env)

    assert code == 0, err
    assert out == "Hello from the fake.\n"
    assert fake.received[0].headers["Authorization"] == f"Bearer {KEY}"
    assert fake.received[0].body["model"] == "fake-model"
    assert KEY not in out + err

    code, out, err = await sessionrt("run", "hi", "--model", "local/other", *args, env=env)
    assert code == 1
    assert err == "sessionrt: InvalidRequestError: provider 'local' has no model 'other'\n"
