"""A revert with files never reaches outside the session's directory (issue 35, point 1).

Each case is an attack a step's bash can mount before the user reverts it:
turn a tracked symlink into a real directory and write under it, so that a
restore which checks out the symlink first then deletes through it; point
the symlink at the data dir; split the paths over two trees. The restore must
make every file operation through the directory as it is at that moment,
never follow a symlink, never touch the data dir, and a restore it refuses
leaves files, log and intents as they were before the request.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from protocol.errors import ConflictError
from protocol.operations import LogQuery, RevertStageInput
from protocol.requests import CreateSessionInput, PromptInput
from protocol.shapes import Location
from server.embedded import Embedded
from tests.shell.conftest import git, tool


async def _prompt(oc: Embedded, sid: str, command: str) -> str:
    text = f"{tool('bash', command=command)}\n#step\n#text ok"
    receipt = await oc.sessions.prompt(sid, PromptInput(text=text))
    await oc.sessions.wait(sid)
    return receipt.id


async def _session(oc: Embedded, work: Path) -> str:
    s = await oc.sessions.create(CreateSessionInput(location=Location(directory=str(work))))
    return s.id


async def _revert_events(oc: Embedded, sid: str) -> list[str]:
    return [e.event async for e in oc.sessions.log(sid, LogQuery()) if "revert" in e.event]


@pytest.fixture
def work(tmp_path: Path) -> Path:
    path = tmp_path / "W"
    path.mkdir()
    git(path, "init", "-q")
    (tmp_path / "V").mkdir()
    (tmp_path / "V" / "f").write_text("secret\n")
    return path


async def test_a_restore_never_deletes_through_a_symlink_it_restored(
    tmp_path: Path, work: Path
) -> None:
    async with Embedded(tmp_path / "data") as oc:
        sid = await _session(oc, work)
        await _prompt(oc, sid, "ln -s ../V d")
        second = await _prompt(oc, sid, "rm d && mkdir d && echo x > d/f")
        await oc.sessions.revert_stage(sid, RevertStageInput(message_id=second, files=True))
        assert (tmp_path / "V" / "f").read_text() == "secret\n"
        assert os.readlink(work / "d") == "../V"  # the symlink is back, pointing where it did
        await oc.sessions.revert_clear(sid)
        assert not (work / "d").is_symlink()
        assert (work / "d" / "f").read_text() == "x\n"
        assert (tmp_path / "V" / "f").read_text() == "secret\n"


async def test_a_restore_never_touches_the_data_dir(tmp_path: Path, work: Path) -> None:
    data = tmp_path / "data"
    async with Embedded(data) as oc:
        # The log's file when it is SQLite (on PostgreSQL the data dir has none).
        live = [p for p in (data / "sessionrt.sqlite",) if p.exists()]
        (data / "canary").write_text("kept\n")
        sid = await _session(oc, work)
        await _prompt(oc, sid, "ln -s ../data d")
        second = await _prompt(
            oc, sid, "rm d && mkdir d && echo x > d/sessionrt.sqlite && echo x > d/canary"
        )
        await oc.sessions.revert_stage(sid, RevertStageInput(message_id=second, files=True))
        assert (data / "canary").read_text() == "kept\n"
        assert all(p.stat().st_size > 0 for p in live)
        # The database is still the live one: the session is listed and answers.
        assert [s.id for s in (await oc.sessions.list()).data] == [sid]
    async with Embedded(data) as oc:
        assert [s.id for s in (await oc.sessions.list()).data] == [sid]


async def test_paths_over_two_trees_are_restored_as_one_confined_plan(
    tmp_path: Path, work: Path
) -> None:
    """``d`` goes back to the tree before one step, ``d/f`` to the tree before the next."""
    async with Embedded(tmp_path / "data") as oc:
        sid = await _session(oc, work)
        await _prompt(oc, sid, "ln -s ../V d")
        second = await _prompt(oc, sid, "rm d && mkdir d && touch d/.keep")
        await _prompt(oc, sid, "echo x > d/f")
        await oc.sessions.revert_stage(sid, RevertStageInput(message_id=second, files=True))
        assert (tmp_path / "V" / "f").read_text() == "secret\n"
        assert os.readlink(work / "d") == "../V"
        assert await _revert_events(oc, sid) == ["session.revert.staged"]


async def test_a_refused_restore_leaves_files_log_and_intents_as_they_were(
    tmp_path: Path, work: Path
) -> None:
    """A directory holding a file no step wrote cannot become the symlink it was: 409."""
    data = tmp_path / "data"
    async with Embedded(data) as oc:
        sid = await _session(oc, work)
        await _prompt(oc, sid, "ln -s ../V d && echo 1 > top")
        second = await _prompt(oc, sid, "rm d && mkdir d && echo x > d/f && echo 2 > top")
        (work / ".gitignore").write_text("d/mine\n")
        (work / "d" / "mine").write_text("the user's own file\n")
        with pytest.raises(ConflictError) as caught:
            await oc.sessions.revert_stage(sid, RevertStageInput(message_id=second, files=True))
        assert caught.value.fields.get("resource") == "files"
        # Nothing moved: not ``top``, which alone could have been restored, nor ``d``.
        assert (work / "top").read_text() == "2\n"
        assert (work / "d" / "f").read_text() == "x\n"
        assert (work / "d" / "mine").read_text() == "the user's own file\n"
        assert (tmp_path / "V" / "f").read_text() == "secret\n"
        assert await _revert_events(oc, sid) == []
        assert (await oc.sessions.get(sid)).revert is None
        assert not list((data / "revert").glob("*")) if (data / "revert").exists() else True
