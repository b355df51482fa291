"""The embedded host: the client API in-process, and nothing left behind on close."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import attrs
import pytest

from actors.runtime import RuntimeConfig
from protocol import SessionNotFoundError
from protocol.errors import ConflictError, InvalidRequestError, PermissionNotFoundError
from protocol.operations import ExportQuery, HealthStatus, LogQuery, PermissionReplyInput
from protocol.requests import (
    CreateSessionInput,
    GenerateInput,
    MoveInput,
    PromptInput,
    ViewInput,
)
from protocol.shapes import Location
from server.embedded import Embedded


async def test_embedded_runs_sessions_and_releases_everything(tmp_path: Path) -> None:
    threads_before = set(threading.enumerate())
    tasks_before = asyncio.all_tasks()
    fds_before = len(os.listdir("/proc/self/fd"))
    async with Embedded(tmp_path / "data") as oc:
        session = await oc.sessions.create()
        await oc.sessions.prompt(session.id, PromptInput(text="hello"))
        await oc.sessions.wait(session.id)
        events = [e.event async for e in oc.sessions.log(session.id)]
        assert events[-1] == "log.synced"
        assert "session.execution.succeeded" in events
        page = await oc.sessions.messages(session.id, None)
        assert [m.type for m in page.data] == ["assistant", "user"]
        assert oc.runtime.store.is_open  # embedded-only extra
        with pytest.raises(SessionNotFoundError):
            await oc.sessions.get("ses_missing")
    assert set(threading.enumerate()) - threads_before == set()  # new ones only
    assert asyncio.all_tasks() == tasks_before
    assert len(os.listdir("/proc/self/fd")) == fds_before


async def test_embedded_opens_no_listening_socket(tmp_path: Path) -> None:
    def listening() -> set[int]:
        inodes = set()
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except FileNotFoundError:  # the directory listing's own descriptor
                continue
            if target.startswith("socket:"):
                inodes.add(int(target[8:-1]))
        found = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6", "/proc/net/unix"):
            with open(table) as f:
                next(f)
                for line in f:
                    cols = line.split()
                    if table.endswith("unix"):
                        # Flags 00010000 = __SO_ACCEPTCON: a listening unix socket.
                        if cols[3] == "00010000" and int(cols[6]) in inodes:
                            found.add(int(cols[6]))
                    elif cols[3] == "0A" and int(cols[9]) in inodes:  # TCP_LISTEN
                        found.add(int(cols[9]))
        return found

    async with Embedded(tmp_path / "data") as oc:
        await oc.sessions.create()
        assert listening() == set()


async def test_embedded_streams_follow_live(tmp_path: Path) -> None:
    config = RuntimeConfig(data_dir=tmp_path / "data", default_directory=str(tmp_path))
    async with Embedded(config=config) as oc:
        session = await oc.sessions.create()
        stream = oc.sessions.log(session.id, LogQuery(follow=True))
        seen = []
        async with stream:
            async for event in stream:
                seen.append(event.event)
                if event.event == "log.synced":
                    await oc.sessions.prompt(session.id, PromptInput(text="go"))
                if event.event == "session.execution.succeeded":
                    break
        assert seen[0] == "session.created"
        assert "session.step.ended" in seen


async def test_lifecycle_is_explicit(tmp_path: Path) -> None:
    oc = Embedded(tmp_path / "data")
    with pytest.raises(RuntimeError):
        _ = oc.sessions
    async with oc:
        pass
    with pytest.raises(RuntimeError):
        await oc.__aenter__()
    with pytest.raises(RuntimeError):
        _ = oc.runtime
    with pytest.raises(ValueError, match="exactly one"):
        Embedded()


async def test_embedded_forks_views_exports_and_imports(tmp_path: Path) -> None:
    async with Embedded(tmp_path / "data") as oc:
        session = await oc.sessions.create()
        await oc.sessions.prompt(session.id, PromptInput(text="#text from the embedded host"))
        await oc.sessions.wait(session.id)
        child = await oc.sessions.fork(session.id)
        assert child.fork_session_id == session.id
        page = await oc.sessions.messages(child.id, None)
        assert [m.type for m in page.data] == ["assistant", "user"]

        idle = (await oc.sessions.get(session.id)).time.idle
        assert idle is not None
        await oc.sessions.view(session.id, ViewInput(idle=idle))
        assert (await oc.sessions.get(session.id)).time.viewed == idle

        answer = await oc.sessions.generate(session.id, GenerateInput(prompt="#text once"))
        assert answer.text == "once"

        document = await oc.sessions.export(session.id, ExportQuery(sanitize=True))
        assert document.info.id == session.id
        copy = attrs.evolve(document, info=attrs.evolve(document.info, id="ses_embedded_copy"))
        imported = await oc.sessions.import_session(copy)
        assert imported.id == "ses_embedded_copy"
        stats = await oc.sessions.stats()
        assert stats.sessions == 3
        assert stats.forks == 1


async def test_embedded_lists_and_answers_permission_requests(tmp_path: Path) -> None:
    data, project = tmp_path / "data", tmp_path / "project"
    data.mkdir(mode=0o700)
    project.mkdir()
    (data / "agents.toml").write_text('[agents.asker.permissions]\nwrite = "ask"\n')
    async with Embedded(data) as oc:
        session = await oc.sessions.create(
            CreateSessionInput(agent="asker", location=Location(directory=str(project)))
        )
        script = '#tool write {"path": "out.txt", "content": "written"}'
        await oc.sessions.prompt(session.id, PromptInput(text=script))
        async with asyncio.timeout(30):  # a guard, never the assertion
            for _ in range(3000):
                if pending := await oc.sessions.permissions(session.id):
                    break
                await asyncio.sleep(0.01)
        [asked] = pending
        assert (asked.tool, asked.permission, asked.patterns) == ("write", "write", ("out.txt",))
        assert not (project / "out.txt").exists()
        await oc.sessions.reply_permission(session.id, asked.id, PermissionReplyInput(reply="once"))
        await oc.sessions.wait(session.id)
        assert (project / "out.txt").read_text() == "written"
        with pytest.raises(ConflictError):
            await oc.sessions.reply_permission(
                session.id, asked.id, PermissionReplyInput(reply="reject")
            )
        with pytest.raises(PermissionNotFoundError):
            await oc.sessions.reply_permission(
                session.id, "per_nothing", PermissionReplyInput(reply="once")
            )
        assert list(await oc.sessions.permissions(session.id)) == []


async def test_health_and_metrics_through_the_typed_client(tmp_path: Path) -> None:
    async with Embedded(tmp_path / "data") as oc:
        assert (await oc.server.health()) == HealthStatus(healthy=True)
        session = await oc.sessions.create()
        await oc.sessions.prompt(session.id, PromptInput(text="#text counted"))
        await oc.sessions.wait(session.id)
        text = await oc.server.metrics()
        # The text exposition format, with the admission just made counted.
        lines = [
            line for line in text.splitlines() if line.startswith("sessionrt_admissions_total")
        ]
        assert lines, text[:400]
        assert sum(float(line.rsplit(" ", 1)[1]) for line in lines) >= 1


async def test_embedded_moves_a_session(tmp_path: Path) -> None:
    home, dest = tmp_path / "home", tmp_path / "dest"
    home.mkdir()
    dest.mkdir()
    async with Embedded(tmp_path / "data") as oc:
        session = await oc.sessions.create(
            CreateSessionInput(location=Location(directory=str(home)))
        )
        with pytest.raises(InvalidRequestError):
            await oc.sessions.move(session.id, MoveInput(directory=str(tmp_path / "missing")))
        await oc.sessions.move(session.id, MoveInput(directory=str(dest)))
        await oc.sessions.wait(session.id)
        assert (await oc.sessions.get(session.id)).location == Location(directory=str(dest))
        assert list(await oc.sessions.inbox(session.id)) == []
