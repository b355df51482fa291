"""A revert asked for files that cannot be restored says so (issue 35, point 4).

A relative data dir used to turn snapshots off without a word (git resolved
the store against the work tree) and the revert then answered 200 having
restored nothing; after a move, the snapshots are in another directory's
store and the stage was an untagged 500 that left its event and an intent.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from serve_proc import serving

from actors.runtime import RuntimeConfig
from protocol.client import Client
from protocol.errors import ConflictError
from protocol.operations import LogQuery, MoveInput, RevertStageInput
from protocol.requests import CreateSessionInput, PromptInput
from protocol.shapes import Location
from server.embedded import Embedded
from tests.shell.conftest import git, tool


def _write(path: str, content: str) -> str:
    return f"{tool('write', path=path, content=content)}\n#step\n#text ok"


def test_every_configured_path_is_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = RuntimeConfig(
        data_dir=Path("data"),
        default_directory="work",
        allow_directories=("a", "/b"),
        database="db.sqlite",
    )
    assert config.data_dir == tmp_path / "data"
    assert config.default_directory == str(tmp_path / "work")
    assert config.allow_directories == (str(tmp_path / "a"), "/b")
    assert config.database == str(tmp_path / "db.sqlite")
    url = "postgresql://u@h/db"
    assert RuntimeConfig(data_dir=tmp_path, database=url).database == url


async def test_a_relative_data_dir_keeps_snapshots_on(tmp_path: Path, repo: Path) -> None:
    async with serving(Path("data"), cwd=tmp_path) as served, Client(served.url) as client:
        s = await client.sessions.create(CreateSessionInput(location=Location(directory=str(repo))))
        receipt = await client.sessions.prompt(s.id, PromptInput(text=_write("a.txt", "changed\n")))
        await client.sessions.wait(s.id)
        assert (repo / "a.txt").read_text() == "changed\n"
        staged = await client.sessions.revert_stage(
            s.id, RevertStageInput(message_id=receipt.id, files=True)
        )
        assert staged.files == ("a.txt",)
        assert (repo / "a.txt").read_text() == "alpha\n"
    assert (tmp_path / "data" / "snapshot").is_dir()
    assert not (repo / "data").exists()


async def _events(oc: Embedded, sid: str) -> list[str]:
    return [e.event async for e in oc.sessions.log(sid, LogQuery())]


async def test_a_files_revert_outside_a_git_work_tree_is_refused(
    tmp_path: Path, host: Embedded
) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    s = await host.sessions.create(CreateSessionInput(location=Location(directory=str(plain))))
    receipt = await host.sessions.prompt(s.id, PromptInput(text=_write("a.txt", "new\n")))
    await host.sessions.wait(s.id)
    before = await _events(host, s.id)
    with pytest.raises(ConflictError) as caught:
        await host.sessions.revert_stage(s.id, RevertStageInput(message_id=receipt.id, files=True))
    assert caught.value.fields == {"resource": "files"}
    assert await _events(host, s.id) == before
    assert (plain / "a.txt").read_text() == "new\n"
    # Without files the transcript alone goes back, as asked.
    await host.sessions.revert_stage(s.id, RevertStageInput(message_id=receipt.id))


async def test_a_step_whose_snapshot_failed_makes_a_files_revert_refuse(
    tmp_path: Path, repo: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "snapshot").write_text("not a directory: every snapshot fails")
    async with Embedded(data) as oc:
        s = await oc.sessions.create(CreateSessionInput(location=Location(directory=str(repo))))
        receipt = await oc.sessions.prompt(s.id, PromptInput(text=_write("a.txt", "x\n")))
        await oc.sessions.wait(s.id)
        with pytest.raises(ConflictError):
            await oc.sessions.revert_stage(
                s.id, RevertStageInput(message_id=receipt.id, files=True)
            )
        assert (await oc.sessions.get(s.id)).revert is None


async def test_a_files_revert_after_a_move_is_refused_before_anything_is_written(
    tmp_path: Path, repo: Path, host: Embedded
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    git(other, "init", "-q")
    s = await host.sessions.create(CreateSessionInput(location=Location(directory=str(repo))))
    receipt = await host.sessions.prompt(s.id, PromptInput(text=_write("a.txt", "changed\n")))
    await host.sessions.wait(s.id)
    await host.sessions.move(s.id, MoveInput(directory=str(other)))
    await host.sessions.prompt(s.id, PromptInput(text="#text moved"))
    await host.sessions.wait(s.id)
    assert (await host.sessions.get(s.id)).location.directory == str(other)
    before = await _events(host, s.id)
    with pytest.raises(ConflictError) as caught:
        await host.sessions.revert_stage(s.id, RevertStageInput(message_id=receipt.id, files=True))
    assert "moved" in caught.value.message
    assert await _events(host, s.id) == before  # no stage event
    intents = tmp_path / "data" / "revert"
    assert not intents.exists() or os.listdir(intents) == []
    assert (repo / "a.txt").read_text() == "changed\n"
    assert (await host.sessions.get(s.id)).revert is None
