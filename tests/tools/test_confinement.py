"""Confinement probes at the tool level: the project's configuration and the environment."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from actors.tools import PASSWORD_ENV, ToolContext, ToolError, is_secret, tool_environment
from actors.tools.builtin import (
    BashTool,
    EditTool,
    GlobTool,
    GrepTool,
    ListTool,
    ReadTool,
    WriteTool,
)

MakeCtx = Callable[..., ToolContext]


def denied(call: Callable[[], object]) -> ToolError:
    with pytest.raises(ToolError) as raised:
        call()
    assert raised.value.type == "denied"
    return raised.value


# -- the project's configuration -------------------------------------------------------------


@pytest.mark.parametrize(
    "path", [".sessionrt/agents.toml", ".sessionrt", "sub/../.sessionrt/x.toml", "./.sessionrt/a"]
)
def test_writes_into_the_project_config_are_denied(
    location: Path, ctx: ToolContext, path: str
) -> None:
    (location / "sub").mkdir()
    error = denied(lambda: WriteTool().run({"path": path, "content": "x"}, ctx))
    assert "config" in error.message
    assert not (location / ".sessionrt").exists()


def test_edits_of_the_project_config_are_denied(location: Path, ctx: ToolContext) -> None:
    config = location / ".sessionrt" / "agents.toml"
    config.parent.mkdir()
    config.write_text('[agents.plan.permissions]\nbash = "deny"\n')
    call = {"path": ".sessionrt/agents.toml", "old_string": "deny", "new_string": "allow"}
    denied(lambda: EditTool().run(call, ctx))
    assert config.read_text() == '[agents.plan.permissions]\nbash = "deny"\n'


def test_a_symlinked_config_dir_is_protected_by_where_it_leads(
    location: Path, ctx: ToolContext
) -> None:
    (location / "cfg").mkdir()
    (location / ".sessionrt").symlink_to(location / "cfg")
    denied(lambda: WriteTool().run({"path": "cfg/agents.toml", "content": "x"}, ctx))
    # And a link elsewhere in the Location that leads into .sessionrt.
    (location / "way-in").symlink_to(location / ".sessionrt")
    denied(lambda: WriteTool().run({"path": "way-in/agents.toml", "content": "x"}, ctx))
    assert list((location / "cfg").iterdir()) == []


def test_the_config_capability_allows_the_write(location: Path, make_ctx: MakeCtx) -> None:
    ctx = make_ctx(config_writes=True)
    WriteTool().run({"path": ".sessionrt/agents.toml", "content": "[agents]\n"}, ctx)
    assert (location / ".sessionrt" / "agents.toml").read_text() == "[agents]\n"


def test_other_dotfiles_stay_writable(location: Path, ctx: ToolContext) -> None:
    WriteTool().run({"path": ".sessionrtx/a", "content": "x"}, ctx)
    WriteTool().run({"path": "sub/.sessionrt/a", "content": "x"}, ctx)
    assert (location / ".sessionrtx" / "a").exists()
    assert (location / "sub" / ".sessionrt" / "a").exists()


# -- the environment -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        PASSWORD_ENV,
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "GITHUB_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "PGPASSWORD",
        "my_service_password",
        "STRIPE_KEY",
        "GOOGLE_APPLICATION_CREDENTIALS",
        # Issue 35: the common spellings the rule used to miss.
        "DB_PASS",
        "SMTP_PASS",
        "dbpass",
        "MYSQL_PWD",
        "DBPWD",
        "GPG_PASSPHRASE",
        "SSH_PRIVATE_KEY_PATH",
        "AWS_SHARED_CREDENTIALS_FILE",
        "GH_AUTH",
        "BASIC_AUTH_HEADER",
        "HTTP_AUTHORIZATION",
        "NPM_AUTHTOKEN",
        # The agent socket signs with the user's keys: a credential too.
        "SSH_AUTH_SOCK",
    ],
)
def test_credential_names_are_secret(name: str) -> None:
    assert is_secret(name)
    assert name not in tool_environment({name: "v", "PATH": "/bin"})


@pytest.mark.parametrize(
    "name",
    [
        "PATH",
        "HOME",
        "LANG",
        "TERM",
        "KEYBOARD",
        "PWD",
        "OLDPWD",
        "GIT_AUTHOR_NAME",
        "GIT_AUTHOR_EMAIL",
        "PASSENGER_COUNT",
    ],
)
def test_ordinary_names_are_kept(name: str) -> None:
    assert not is_secret(name)
    assert tool_environment({name: "v"}) == {name: "v"}


def test_operator_named_variables_are_removed() -> None:
    env = tool_environment({"ACME_LOGIN": "x", "PATH": "/bin"}, secret_env=["ACME_LOGIN"])
    assert env == {"PATH": "/bin"}


def test_operator_patterns_are_removed_case_insensitively() -> None:
    base = {"VAULT_ADDR": "a", "vault_role": "b", "ACME_PIN": "c", "PATH": "/bin"}
    assert tool_environment(base, secret_env=["VAULT_*", "*_pin"]) == {"PATH": "/bin"}


def test_bash_does_not_inherit_the_servers_secrets(
    monkeypatch: pytest.MonkeyPatch, make_ctx: MakeCtx
) -> None:
    monkeypatch.setenv(PASSWORD_ENV, "pw-canary-1")
    monkeypatch.setenv("OPENAI_API_KEY", "key-canary-2")
    monkeypatch.setenv("ACME_LOGIN", "login-canary-3")
    monkeypatch.setenv("SESSIONRT_HARMLESS", "kept-canary")
    ctx = make_ctx(secret_env=frozenset({"ACME_LOGIN"}))
    # Both what the shell sees and what its children read from /proc.
    command = "env; cat /proc/self/environ | tr '\\0' '\\n'"
    result = BashTool().run({"command": command}, ctx)
    text: str = result.content[0]["text"]
    assert "SESSIONRT_HARMLESS=kept-canary" in text
    for canary in ("pw-canary-1", "key-canary-2", "login-canary-3"):
        assert canary not in text
    assert os.environ[PASSWORD_ENV] == "pw-canary-1"  # the server keeps its own


# -- the server's directories ----------------------------------------------------------------


@pytest.fixture
def server_ctx(location: Path, make_ctx: MakeCtx) -> ToolContext:
    """A Location that holds the data dir (say, a home directory)."""
    data = location / "data"
    (data / "tool-output").mkdir(parents=True)
    (data / "sessionrt.sqlite-wal").write_text("canary from another session\n")
    (data / "agents.toml").write_text('[agents.plan]\nsystem = "canary"\n')
    (data / "tool-output" / "tool_01").write_text("managed output\n")
    (location / "mine.txt").write_text("canary of my own\n")
    (location / "link.toml").symlink_to(data / "agents.toml")
    return make_ctx(server_dirs=(data,), output_dir=data / "tool-output")


@pytest.mark.parametrize("path", ["data/agents.toml", "link.toml", "data", "./data/../data/x"])
def test_the_data_dir_is_out_of_bounds_inside_the_location(
    server_ctx: ToolContext, path: str
) -> None:
    error = denied(lambda: ReadTool().run({"path": path}, server_ctx))
    assert "belongs to the server" in error.message
    denied(lambda: WriteTool().run({"path": path, "content": "x"}, server_ctx))
    denied(lambda: ListTool().run({"path": path}, server_ctx))


def test_walks_skip_the_data_dir(server_ctx: ToolContext) -> None:
    found = GrepTool().run({"pattern": "canary"}, server_ctx).content[0]["text"]
    assert "mine.txt" in found
    assert "another session" not in found
    assert "data/" not in found
    assert "link.toml" not in found
    listed = GlobTool().run({"pattern": "**"}, server_ctx).content[0]["text"]
    assert "mine.txt" in listed
    assert "data/" not in listed
    assert "link.toml" not in listed


def test_managed_output_stays_readable(location: Path, server_ctx: ToolContext) -> None:
    managed = str(location / "data" / "tool-output" / "tool_01")
    assert "managed output" in ReadTool().run({"path": managed}, server_ctx).content[0]["text"]


def test_an_allowed_location_inside_the_data_dir_works(location: Path, make_ctx: MakeCtx) -> None:
    # The operator listed the data dir in allow_directories: its tools work there.
    (location / "a.txt").write_text("here\n")
    ctx = make_ctx(server_dirs=(location,))
    assert "here" in ReadTool().run({"path": "a.txt"}, ctx).content[0]["text"]
