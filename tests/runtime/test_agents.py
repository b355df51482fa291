"""Agent configuration: built-ins, the data dir's file, the project's file."""

from __future__ import annotations

from pathlib import Path

import pytest
from feed import Feed

from actors.agents import DEFAULT_AGENT, load_catalog, project_file
from actors.runtime import Runtime
from protocol import InvalidRequestError, ModelRef
from protocol.requests import CreateSessionInput, PromptInput, UpdateSessionInput


def test_builtins_without_files(tmp_path: Path) -> None:
    catalog = load_catalog(tmp_path / "missing.toml")
    assert catalog.get(None).name == DEFAULT_AGENT
    assert catalog.get("nobody").name == DEFAULT_AGENT
    assert catalog.get("build").steps is None  # absent means unlimited
    assert catalog.get("plan").permissions["bash"] == "deny"


def test_later_files_override_field_by_field(tmp_path: Path) -> None:
    data = tmp_path / "agents.toml"
    data.write_text(
        '[agents.build]\nsteps = 5\nsystem = "data"\n'
        '[agents.build.permissions]\nbash = "deny"\n'
        '[agents.extra]\nmodel = { id = "m", providerID = "p" }\n'
    )
    project = project_file(tmp_path / "proj")
    project.parent.mkdir(parents=True)
    project.write_text(
        '[agents.build]\nsystem = "project"\n[agents.build.permissions]\nread = "deny"\n'
    )
    catalog = load_catalog(data, project=project)
    build = catalog.get("build")
    assert (build.steps, build.system) == (5, "project")
    assert build.permissions == {"*": "allow", "bash": "deny", "read": "deny"}
    assert catalog.get("extra").model == ModelRef(id="m", provider_id="p")


@pytest.mark.parametrize(
    "text",
    [
        "[agents.build\n",
        "[agents.build]\nsteps = 0\n",
        '[agents.build]\nsteps = "many"\n',
        '[agents.build.permissions]\nbash = "maybe"\n',
        '[agents.build]\nmodel = { id = "m" }\n',
        "agents = 3\n",
    ],
)
def test_bad_files_are_clear_errors(tmp_path: Path, text: str) -> None:
    path = tmp_path / "agents.toml"
    path.write_text(text)
    with pytest.raises(InvalidRequestError, match=r"agents"):
        load_catalog(path)


async def test_a_project_agent_script_drives_the_scripted_model(
    runtime: Runtime, feed: Feed, workdir: Path
) -> None:
    path = project_file(workdir)
    path.parent.mkdir()
    path.write_text("[agents.demo]\nscript = '''\n#text from the project script\n'''\n")
    s = await runtime.sessions.create(CreateSessionInput(agent="demo"))
    await runtime.sessions.prompt(s.id, PromptInput(text="hello"))
    ended = await feed.wait("session.text.ended", sessionID=s.id)
    assert ended["data"]["text"] == "from the project script"


async def test_a_session_metadata_script_wins(runtime: Runtime, feed: Feed) -> None:
    s = await runtime.sessions.create()
    await runtime.sessions.update(
        s.id, UpdateSessionInput(metadata={"script": "#text from session metadata"})
    )
    await runtime.sessions.prompt(s.id, PromptInput(text="hello"))
    ended = await feed.wait("session.text.ended", sessionID=s.id)
    assert ended["data"]["text"] == "from session metadata"
