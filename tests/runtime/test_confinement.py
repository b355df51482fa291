"""The operator's rules win: project agents.toml, tool writes into .sessionrt/, tool env."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from feed import Feed

from actors.agents import load_catalog, project_file
from actors.runtime import Runtime, RuntimeConfig
from actors.tools import PASSWORD_ENV, permission
from protocol.requests import CreateSessionInput, PromptInput


def write_project(workdir: Path, text: str) -> Path:
    path = project_file(workdir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# -- precedence ------------------------------------------------------------------------------


def test_a_project_cannot_widen_a_builtin_agent(tmp_path: Path) -> None:
    project = write_project(
        tmp_path,
        '[agents.plan.permissions]\nbash = "allow"\nwrite = "allow"\n"*" = "allow"\n'
        'config = "allow"\n'
        '[agents.build.permissions]\nconfig = "allow"\n',
    )
    catalog = load_catalog(tmp_path / "none.toml", project=project)
    plan, build = catalog.get("plan"), catalog.get("build")
    for tool in ("bash", "write", "edit", "config"):
        assert permission(plan.permissions, tool) == "deny", tool
    assert permission(plan.permissions, "read") == "allow"
    assert permission(build.permissions, "config") == "deny"


def test_a_project_cannot_widen_an_operator_agent(tmp_path: Path) -> None:
    operator = tmp_path / "agents.toml"
    operator.write_text(
        '[agents.build]\nsteps = 10\n[agents.build.permissions]\nbash = "deny"\n'
        '[agents.ci.permissions]\n"*" = "deny"\nread = "allow"\n'
    )
    project = write_project(
        tmp_path / "p",
        '[agents.build]\nsteps = 50\nsystem = "project prompt"\n'
        '[agents.build.permissions]\nbash = "allow"\ngrep = "deny"\n'
        '[agents.ci.permissions]\n"*" = "allow"\n',
    )
    catalog = load_catalog(operator, project=project)
    build, ci = catalog.get("build"), catalog.get("ci")
    assert build.steps == 10  # only lowered, never raised
    assert build.system == "project prompt"  # not a permission: the project may say it
    assert permission(build.permissions, "bash") == "deny"
    assert permission(build.permissions, "grep") == "deny"  # narrowing works
    assert permission(build.permissions, "read") == "allow"
    assert permission(ci.permissions, "bash") == "deny"
    assert permission(ci.permissions, "read") == "allow"


def test_a_new_project_agent_is_bounded_by_build(tmp_path: Path) -> None:
    operator = tmp_path / "agents.toml"
    operator.write_text(
        '[agents.build]\nsteps = 7\n[agents.build.permissions]\nbash = "deny"\nconfig = "allow"\n'
    )
    project = write_project(
        tmp_path / "p",
        '[agents.mine]\nsteps = 99\n[agents.mine.permissions]\nbash = "allow"\nread = "deny"\n',
    )
    mine = load_catalog(operator, project=project).get("mine")
    assert mine.name == "mine"
    assert mine.steps == 7
    assert permission(mine.permissions, "bash") == "deny"
    assert permission(mine.permissions, "read") == "deny"
    assert permission(mine.permissions, "write") == "allow"
    # A capability is never implied, not even by the ceiling; asked for, build's bounds it.
    assert permission(mine.permissions, "config") == "deny"
    project.write_text('[agents.mine.permissions]\nconfig = "allow"\n')
    assert permission(
        load_catalog(operator, project=project).get("mine").permissions, "config"
    ) == ("allow")
    assert permission(load_catalog(project=project).get("mine").permissions, "config") == "deny"


def test_the_operator_file_may_widen_the_builtins(tmp_path: Path) -> None:
    operator = tmp_path / "agents.toml"
    operator.write_text('[agents.plan.permissions]\nbash = "allow"\nconfig = "allow"\n')
    plan = load_catalog(operator).get("plan")
    assert permission(plan.permissions, "bash") == "allow"
    assert permission(plan.permissions, "config") == "allow"


async def test_a_project_file_allowing_bash_for_plan_is_ignored(
    runtime: Runtime, feed: Feed, workdir: Path
) -> None:
    write_project(workdir, '[agents.plan.permissions]\nbash = "allow"\n')
    s = await runtime.sessions.create(CreateSessionInput(agent="plan"))
    script = '#tool bash {"command": "touch ran"}\n#step\n#text done'
    await runtime.sessions.prompt(s.id, PromptInput(text=script))
    failed = await feed.wait("session.tool.failed", sessionID=s.id)
    assert "Permission denied" in failed["data"]["error"]["message"]
    await runtime.execution.wait_idle(s.id)
    assert not (workdir / "ran").exists()


# -- tool writes into .sessionrt/ ------------------------------------------------------------

SELF_PROMOTION = (
    '#tool write {"path": ".sessionrt/agents.toml", "content": '
    + json.dumps('[agents.plan.permissions]\nbash = "allow"\n')
    + "}\n#step\n#text carried on"
)


async def test_an_agent_cannot_write_its_own_agents_toml(
    runtime: Runtime, feed: Feed, workdir: Path
) -> None:
    s = await runtime.sessions.create()
    await runtime.sessions.prompt(s.id, PromptInput(text=SELF_PROMOTION))
    failed = await feed.wait("session.tool.failed", sessionID=s.id)
    assert failed["data"]["error"]["type"] == "denied"
    assert "config" in failed["data"]["error"]["message"]
    # A tool failure, not a refused permission: the step goes on.
    ended = await feed.wait("session.text.ended", sessionID=s.id)
    assert ended["data"]["text"] == "carried on"
    await feed.wait("session.execution.succeeded", sessionID=s.id)
    assert not (workdir / ".sessionrt").exists()


async def test_the_operator_can_allow_config_writes(tmp_path: Path, workdir: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "agents.toml").write_text('[agents.build.permissions]\nconfig = "allow"\n')
    config = RuntimeConfig(data_dir=data, default_directory=str(workdir))
    async with Runtime(config) as runtime:
        feed = Feed()
        runtime.bus.subscribe(feed)
        s = await runtime.sessions.create()
        await runtime.sessions.prompt(s.id, PromptInput(text=SELF_PROMOTION))
        await feed.wait("session.tool.success", sessionID=s.id)
        await feed.wait("session.execution.succeeded", sessionID=s.id)
    assert project_file(workdir).read_text() == '[agents.plan.permissions]\nbash = "allow"\n'


# -- environment -----------------------------------------------------------------------------


async def test_bash_in_a_session_does_not_see_the_servers_secrets(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, workdir: Path
) -> None:
    monkeypatch.setenv(PASSWORD_ENV, "pw-canary-1")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "key-canary-2")
    monkeypatch.setenv("ACME_PROVIDER_LOGIN", "login-canary-3")
    monkeypatch.setenv("SESSIONRT_VISIBLE", "visible-canary")
    config = RuntimeConfig(
        data_dir=tmp_path / "data",
        default_directory=str(workdir),
        secret_env=["ACME_PROVIDER_LOGIN"],
    )
    async with Runtime(config) as runtime:
        feed = Feed()
        runtime.bus.subscribe(feed)
        s = await runtime.sessions.create()
        await runtime.sessions.prompt(s.id, PromptInput(text='#tool bash {"command": "env"}'))
        success = await feed.wait("session.tool.success", sessionID=s.id)
        await runtime.execution.wait_idle(s.id)
    text = success["data"]["content"][0]["text"]
    assert "SESSIONRT_VISIBLE=visible-canary" in text
    for canary in ("pw-canary-1", "key-canary-2", "login-canary-3"):
        assert canary not in text


async def test_an_agent_cannot_rewrite_the_operators_agents_toml(tmp_path: Path) -> None:
    # The session lives in a directory that holds the data dir (a home directory, say).
    data = tmp_path / "data"
    async with Runtime(RuntimeConfig(data_dir=data, default_directory=str(tmp_path))) as runtime:
        feed = Feed()
        runtime.bus.subscribe(feed)
        s = await runtime.sessions.create()
        script = (
            '#tool write {"path": "data/agents.toml", "content": '
            + json.dumps('[agents.build.permissions]\nconfig = "allow"\n')
            + '}\n#tool read {"path": "data/sessionrt.sqlite-wal"}'
        )
        await runtime.sessions.prompt(s.id, PromptInput(text=script))
        await feed.wait("session.execution.succeeded", sessionID=s.id)
    failures = [m["data"]["error"] for m in feed.events if m["type"] == "session.tool.failed"]
    assert [f["type"] for f in failures] == ["denied", "denied"]
    assert all("belongs to the server" in f["message"] for f in failures)
    assert not (data / "agents.toml").exists()
