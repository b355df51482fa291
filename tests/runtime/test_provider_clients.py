"""The runtime owns the providers' HTTP clients: one per provider, closed when it closes."""

from __future__ import annotations

from pathlib import Path

from llm.fake_providers import FakeProvider, Reply, openai_text

from actors.llm import ModelLimits, ProviderConfig
from actors.runtime import Runtime, RuntimeConfig
from protocol.requests import CreateSessionInput, PromptInput
from protocol.shapes import ModelRef


async def test_one_client_per_provider_closed_with_the_runtime(
    tmp_path: Path, workdir: Path
) -> None:
    async with FakeProvider() as fake:
        provider = ProviderConfig(
            id="local",
            kind="openai",
            base_url=fake.openai_url,
            models={"m": ModelLimits(context=1000, output=100)},
        )
        config = RuntimeConfig(
            data_dir=tmp_path / "data",
            default_directory=str(workdir),
            provider_configs={"local": provider},
        )
        runtime = Runtime(config)
        async with runtime as rt:
            model = ModelRef(id="m", provider_id="local")
            session = await rt.sessions.create(CreateSessionInput(model=model))
            for text in ("one", "two"):
                fake.replies.append(Reply.stream(openai_text([text])))
                await rt.sessions.prompt(session.id, PromptInput(text=text, resume=False))
                terminal = await rt.execution.resume(session.id)
                assert terminal.kind == "succeeded"
            client = rt.services.adapters["local"].transport._session
            assert client is not None
            assert not client.closed
        assert client.closed
        assert len(fake.received) == 2
