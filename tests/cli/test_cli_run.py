"""``sessionrt run | sessions | log | openapi``: through the CLI's ``main`` in-process, and
one end-to-end test per command (and Ctrl-C, and the working directory) on real
subprocesses of the console script."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sqlite3
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from cli_inprocess import Done, sessionrt
from http_helpers import TestServer
from proc_groups import kill_group

from actors.runtime import Runtime, RuntimeConfig
from protocol import events as ev
from protocol.requests import CreateSessionInput, PromptInput
from server.app import ServerSettings, make_app, runner_options
from storage import Command

EXE = str(Path(sys.executable).with_name("sessionrt"))
TIMEOUT = 30
TOOL_SCRIPT = '#tool bash {"command": "echo hi"}\n#step\n#text finished'


async def sessionrt_process(*args: str, env: dict[str, str] | None = None) -> Done:
    """``sessionrt ARGS`` as a real subprocess of the console script: one end-to-end test
    per command; the rest call ``main`` in-process (tests/cli_inprocess.py)."""
    proc = await asyncio.create_subprocess_exec(
        EXE,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT)
    finally:
        kill_group(proc)
    done = Done(proc.returncode, out.decode(), err.decode())
    assert "Traceback" not in done.err, done.err
    return done


def session_of(done: Done) -> str:
    match = re.search(r"session (ses_\w+)", done.err)
    assert match, done.err
    return match.group(1)


@pytest.fixture
def data(tmp_path: Path) -> list[str]:
    return ["--data-dir", str(tmp_path / "data")]


# -- run, embedded ------------------------------------------------------------------------------


async def test_run_streams_the_answer_to_stdout(data: list[str]) -> None:
    done = await sessionrt_process("run", "hello", *data)
    assert done.code == 0, done.err
    assert done.out == "Scripted reply: hello\n"
    session_of(done)


async def test_run_shows_tool_activity_on_stderr_without_a_spinner(data: list[str]) -> None:
    done = await sessionrt("run", TOOL_SCRIPT, *data)
    assert done.code == 0, done.err
    assert done.out == "finished\n"
    assert '⚙ bash {"command": "echo hi"}' in done.err
    assert "✓ bash" in done.err
    assert "\r" not in done.err  # stderr is not a terminal: no spinner


async def test_a_failed_tool_is_shown_with_its_error(data: list[str]) -> None:
    done = await sessionrt("run", "#tool nosuch {}\n#step\n#text after", *data)
    assert done.code == 0, done.err
    assert "✗ nosuch: Unknown tool 'nosuch'" in done.err
    assert done.out == "after\n"


async def test_a_failed_run_exits_1_with_the_error(data: list[str]) -> None:
    done = await sessionrt("run", "#fail auth", *data)
    assert done.code == 1
    assert "provider.authentication: Scripted auth failure" in done.err
    assert done.out == ""


async def test_continuing_a_session_switching_agent_and_model(data: list[str]) -> None:
    first = await sessionrt("run", "one", *data)
    session = session_of(first)
    again = await sessionrt(
        "run", "two", "--session", session, "--agent", "plan", "--model", "scripted/other", *data
    )
    assert again.code == 0, again.err
    assert again.out == "Scripted reply: two\n"
    assert session_of(again) == session
    log = (await sessionrt("log", session, *data)).lines()
    steps = [e["data"] for e in log if e.get("type") == "session.step.started"]
    assert steps[-1]["agent"] == "plan"
    assert steps[-1]["model"] == {"id": "other", "providerID": "scripted"}


async def test_an_unknown_provider_is_refused_before_anything_runs(data: list[str]) -> None:
    done = await sessionrt("run", "hi", "--model", "nowhere/m", *data)
    assert done.code == 1
    assert done.err == "sessionrt: InvalidRequestError: unknown provider 'nowhere'\n"
    listed = await sessionrt("sessions", "--json", *data)
    assert json.loads(listed.out) == []


async def test_a_missing_session_is_a_clear_error(data: list[str]) -> None:
    done = await sessionrt("run", "hi", "--session", "ses_1a22a3be2a7000JvJTfrpOXG6sZp", *data)
    assert done.code == 1
    assert done.err.strip() == "sessionrt: session ses_1a22a3be2a7000JvJTfrpOXG6sZp not found"
    bad = await sessionrt("log", "nope", *data)
    assert bad.code == 1
    assert bad.err.startswith("sessionrt: InvalidRequestError: ")


async def test_no_follow_prints_the_receipt_and_log_shows_it(data: list[str]) -> None:
    done = await sessionrt("run", "later", "--no-follow", "--queue", *data)
    assert done.code == 0, done.err
    receipt = json.loads(done.out)
    session = session_of(done)
    assert receipt["sessionID"] == session
    assert receipt["id"].startswith("msg_")
    assert receipt["delivery"] == "queue"
    assert receipt["payload"] == {"text": "later"}
    log = (await sessionrt("log", session, *data)).lines()
    types = [e["type"] for e in log]
    assert "session.inbox.enqueued" in types
    # Every line is an event of the session: the end-of-replay marker is not printed.
    assert "log.synced" not in types
    assert [e["durable"]["seq"] for e in log] == list(range(1, len(log) + 1))
    after = (await sessionrt("log", session, "--after", "1", *data)).lines()
    assert [e["type"] for e in after] == types[1:]


async def test_ctrl_c_interrupts_the_run_and_exits_130(data: list[str]) -> None:
    proc = await asyncio.create_subprocess_exec(
        EXE,
        "run",
        "#delay 100\n#chunk 2\n#text " + "x" * 200,
        *data,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert await asyncio.wait_for(proc.stdout.read(2), TIMEOUT) == b"xx"  # it is streaming
    proc.send_signal(signal.SIGINT)
    _, err = await asyncio.wait_for(proc.communicate(), TIMEOUT)
    assert proc.returncode == 130, err
    assert b"Traceback" not in err
    assert b"sessionrt: interrupted" in err
    session = session_of(Done(0, "", err.decode()))
    log = (await sessionrt("log", session, *data)).lines()
    assert log[-1]["type"] == "session.execution.interrupted"
    assert log[-1]["data"]["reason"] == "user"


# -- sessions, log --follow, openapi ------------------------------------------------------------


async def test_sessions_lists_what_run_created_in_the_xdg_data_home(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path)}
    first = session_of(await sessionrt("run", "one", env=env))
    second = session_of(await sessionrt("run", "two", env=env))
    assert (tmp_path / "sessionrt" / "sessionrt.sqlite").exists()
    listed = json.loads((await sessionrt("sessions", "--json", env=env)).out)
    assert [s["id"] for s in listed] == [second, first]
    assert {"title", "time"} <= listed[0].keys()
    limited = json.loads((await sessionrt("sessions", "--json", "--limit", "1", env=env)).out)
    assert [s["id"] for s in limited] == [second]
    table = (await sessionrt("sessions", env=env)).out.splitlines()
    assert table[0].split() == ["ID", "UPDATED", "TITLE"]
    assert [row.split()[0] for row in table[1:]] == [second, first]


async def test_log_follow_stops_cleanly_on_ctrl_c(data: list[str]) -> None:
    session = session_of(await sessionrt("run", "hello", *data))
    proc = await asyncio.create_subprocess_exec(
        EXE,
        "log",
        session,
        "--follow",
        *data,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    seen: list[dict[str, Any]] = []
    while not seen or seen[-1]["type"] != "session.execution.succeeded":
        line = await asyncio.wait_for(proc.stdout.readline(), TIMEOUT)
        assert line, "the log ended before the run's end"
        seen.append(json.loads(line))
    assert all(e["type"] != "log.synced" for e in seen)
    assert seen[0]["type"] == "session.created"
    proc.send_signal(signal.SIGINT)
    _, err = await asyncio.wait_for(proc.communicate(), TIMEOUT)
    assert proc.returncode == 0
    assert err == b""


async def test_version_help_and_a_bad_port_are_clear() -> None:
    version = await sessionrt("--version")
    assert version.code == 0
    assert re.fullmatch(r"sessionrt \d+\.\d+\.\d+\S*\n", version.out)
    helped = await sessionrt("--help")
    description = " ".join(helped.out.split("positional arguments")[0].split()[3:])
    assert description.endswith("."), description  # whole sentences, not cut mid-way
    assert "--url" in description
    bad = await sessionrt("serve", "--port", "99999")
    assert bad.code == 2
    assert "0 to 65535" in bad.err


async def test_a_bad_port_in_the_config_file_is_clear(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[server]\nport = 70000\n")
    done = await sessionrt("serve", "--config", str(config), "--data-dir", str(tmp_path / "d"))
    assert done.code == 1
    assert done.err == "sessionrt: [server] port must be 0 to 65535, got 70000\n"


async def test_openapi_prints_the_document() -> None:
    done = await sessionrt_process("openapi")
    assert done.code == 0
    doc = json.loads(done.out)
    assert doc["openapi"] == "3.1.0"
    assert "/api/session/{sessionID}/prompt" in doc["paths"]


# -- against a running server -------------------------------------------------------------------


@attrs.frozen
class Served:
    url: str
    data: list[str]


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    """What ``sessionrt serve --password s3cret`` serves (the app on serve's runner), in
    this process on loopback: the CLI, whose ``main`` runs in a thread with its own
    loop, talks to it over TCP. Serving as a real process is tests/cli/test_cli.py's."""
    data = tmp_path / "served"
    settings = ServerSettings(password="s3cret")
    app = make_app(config=RuntimeConfig(data_dir=data), settings=settings)
    options = runner_options(settings)
    options.pop("handler_cancellation")  # TestServer always adds it itself
    server = TestServer(app)
    await server.start_server(**options)
    try:
        yield Served(f"http://{server.host}:{server.port}", ["--data-dir", str(data)])
    finally:
        await server.close()


async def test_run_sessions_and_log_over_the_network(served: Served) -> None:
    env = {**os.environ, "SESSIONRT_SERVER_PASSWORD": "s3cret"}
    remote = ["--url", served.url]
    done = await sessionrt("run", TOOL_SCRIPT, *remote, env=env)
    assert done.code == 0, done.err
    assert done.out == "finished\n"
    assert '⚙ bash {"command": "echo hi"}' in done.err
    session = session_of(done)
    listed = json.loads((await sessionrt("sessions", "--json", *remote, env=env)).out)
    assert [s["id"] for s in listed] == [session]
    log = (await sessionrt("log", session, *remote, env=env)).lines()
    assert log[-1]["type"] == "session.execution.succeeded"
    # --no-follow on a server: the server runs what was admitted.
    queued = await sessionrt("run", "later", "--no-follow", *remote, "--password", "s3cret")
    assert queued.code == 0, queued.err
    assert json.loads(queued.out)["payload"] == {"text": "later"}


async def test_run_over_the_network_works_in_the_callers_directory(
    served: Served, tmp_path: Path
) -> None:
    env = {**os.environ, "SESSIONRT_SERVER_PASSWORD": "s3cret"}
    here = tmp_path / "caller dir"
    here.mkdir()
    proc = await asyncio.create_subprocess_exec(
        EXE,
        "run",
        '#tool bash {"command": "pwd"}\n#step\n#text done',
        "--url",
        served.url,
        cwd=here,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), TIMEOUT)
    assert proc.returncode == 0, err
    session = session_of(Done(0, "", err.decode()))
    listed = json.loads((await sessionrt("sessions", "--json", "--url", served.url, env=env)).out)
    mine = next(s for s in listed if s["id"] == session)
    assert mine["location"]["directory"] == str(here)
    log = (await sessionrt("log", session, "--url", served.url, env=env)).lines()
    outputs = [e["data"] for e in log if e["type"] == "session.tool.success"]
    assert str(here) in json.dumps(outputs)


async def test_openapi_from_a_running_server(served: Served) -> None:
    env = {**os.environ, "SESSIONRT_SERVER_PASSWORD": "s3cret"}
    done = await sessionrt("openapi", "--url", served.url, env=env)
    assert done.code == 0, done.err
    assert "/api/session/{sessionID}/prompt" in json.loads(done.out)["paths"]
    bare = {k: v for k, v in env.items() if k != "SESSIONRT_SERVER_PASSWORD"}
    refused = await sessionrt("openapi", "--url", served.url, env=bare)
    assert refused.code == 1
    assert "password" in refused.err


async def test_a_server_refuses_a_missing_password(served: Served) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SESSIONRT_SERVER_PASSWORD"}
    done = await sessionrt("sessions", "--url", served.url, env=env)
    assert done.code == 1
    assert "UnauthorizedError" in done.err
    assert "--password" in done.err


async def test_embedded_use_of_a_served_data_dir_suggests_url(served: Served) -> None:
    done = await sessionrt("run", "hi", *served.data)
    assert done.code == 1
    assert "in use by another process" in done.err
    assert "--url" in done.err


async def test_an_unreachable_server_is_a_clear_error() -> None:
    done = await sessionrt("sessions", "--url", "http://127.0.0.1:9")
    assert done.code == 1
    assert done.err.startswith("sessionrt: cannot reach the server http://127.0.0.1:9")


# -- sessions and log only read ----------------------------------------------------------------
# A session is left claimed, as by a server that died mid-execution. Each such call used to
# run the recovery sweep (one more resume attempt, a restart notice, a resumed execution);
# eleven calls exhausted the session's attempts. Now the file's log and the claim stay as
# they were.

READ_CALLS = 6


def db_snapshot(db: Path) -> tuple[list[Any], list[Any]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        events = conn.execute("SELECT * FROM event ORDER BY position").fetchall()
        claims = conn.execute("SELECT id, time_claimed, resume_attempts FROM session").fetchall()
    finally:
        conn.close()
    return events, claims


@pytest.mark.timeout(300)  # twelve CLI processes: slow on a loaded machine, not hung
async def test_reading_commands_leave_a_claimed_session_and_the_log_untouched(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    config = RuntimeConfig(data_dir=data, default_directory=str(tmp_path), recover=False)
    async with Runtime(config) as rt:
        s = await rt.sessions.create(CreateSessionInput(title="claimed"))
        await rt.sessions.prompt(s.id, PromptInput(text="hello", resume=False))
        await rt.store.append(Command.of(ev.ExecutionStarted(session_id=s.id)))
    db = config.db_path
    before = db_snapshot(db)
    assert before[1][0][1] is not None  # claimed
    assert before[1][0][2] == 0
    for _ in range(READ_CALLS):
        listed = await sessionrt("sessions", "--json", "--data-dir", str(data))
        assert listed.code == 0, listed.err
        assert "claimed" in listed.out
        log = await sessionrt("log", s.id, "--data-dir", str(data))
        assert log.code == 0, log.err
        types = [e.get("type") for e in log.lines()]
        assert "session.execution.started" in types
        assert "session.execution.recovering" not in types
    assert db_snapshot(db) == before


async def test_reading_a_data_dir_without_a_database_creates_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    listed = await sessionrt_process("sessions", "--json", "--data-dir", str(data))
    assert (listed.code, listed.out) == (0, "[]\n")
    log = await sessionrt("log", "ses_1a22a3be2a7000JvJTfrpOXG6sZp", "--data-dir", str(data))
    assert log.code == 1
    assert "not found" in log.err
    assert not data.exists()
