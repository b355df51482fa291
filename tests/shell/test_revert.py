"""Revert: file snapshots per writing step, stage/clear/commit, and diffs, on real git repos."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
from loop_turns import quiesce
from pgdb import stored_and_rebuilt

from actors.files.snapshots import SnapshotError
from actors.session.revert import PAUSE_ENV
from protocol.errors import MessageNotFoundError, SessionBusyError
from protocol.operations import DiffQuery, RevertStageInput, ShellInput
from protocol.requests import CreateSessionInput, PromptInput, SyntheticInput
from protocol.shapes import Location
from server.embedded import Embedded
from tests.shell.conftest import git, tool, tree, until

BINARY = bytes(range(256)) * 4


async def prompt_and_wait(oc: Embedded, session_id: str, text: str) -> str:
    receipt = await oc.sessions.prompt(session_id, PromptInput(text=text))
    await oc.sessions.wait(session_id)
    return receipt.id


async def writing_session(oc: Embedded, repo: Path) -> tuple[str, str, str]:
    """A session whose second prompt edits, deletes, creates and writes binary files."""
    s = await oc.sessions.create(CreateSessionInput(location=Location(directory=str(repo))))
    first = await prompt_and_wait(
        oc, s.id, tool("write", path="b.txt", content="bravo\n") + "\n---\n#text ok"
    )
    (repo / "bin.dat").write_bytes(BINARY)  # the user's own binary file, before prompt 2
    second = await prompt_and_wait(
        oc,
        s.id,
        "\n".join(
            [
                tool("write", path="a.txt", content="ALPHA CHANGED\n"),
                tool("write", path="new/dir/c.txt", content="charlie\n"),
                tool(
                    "bash",
                    command="rm b.txt && head -c 100 /dev/urandom > bin.dat"
                    " && echo noise > ignored.log && mkdir -p ignored && echo x > ignored/y",
                ),
                "---",
                "#text done",
            ]
        ),
    )
    return s.id, first, second


async def test_steps_record_snapshot_and_files(host: Embedded, repo: Path) -> None:
    sid, _, _ = await writing_session(host, repo)
    ended = [
        e.data["data"]
        async for e in host.sessions.log(sid)
        if e.event == "session.step.ended" and e.data["data"].get("snapshot")
    ]
    assert len(ended) == 2
    assert ended[0]["files"] == ["b.txt"]
    # .gitignore'd paths are never part of a snapshot.
    assert ended[1]["files"] == ["a.txt", "b.txt", "bin.dat", "new/dir/c.txt"]
    # Stored outside the project: the project's own git knows nothing new.
    assert "sessionrt" not in git(repo, "log", "--all", "--format=%an")
    assert "snapshot" not in {Path(p).name for p in tree(repo)}


async def test_stage_clear_commit_restore_bytes_exactly(host: Embedded, repo: Path) -> None:
    sid, first, second = await writing_session(host, repo)
    before_second = None
    after = tree(repo)
    staged = await host.sessions.revert_stage(sid, RevertStageInput(message_id=second, files=True))
    assert staged.message_id == second
    assert staged.files is not None
    restored = tree(repo)
    assert restored["a.txt"] == b"alpha\n"
    assert restored["b.txt"] == b"bravo\n"  # deleted by the step: back
    assert restored["bin.dat"] == BINARY  # binary, changed by the step: back
    assert "new/dir/c.txt" not in restored
    assert not (repo / "new").exists()
    assert restored["ignored.log"] == b"noise\n"  # ignored: left alone
    assert restored["ignored/y"] == b"x\n"
    assert restored["keep.txt"] == b"untouched\n"
    before_second = restored
    # The transcript from the message on is hidden while staged.
    page = await host.sessions.messages(sid, None)
    assert second not in [m.id for m in page.data]
    assert first in [m.id for m in page.data]
    assert (await host.sessions.get(sid)).revert == staged
    # Clear: files and transcript come back, byte for byte.
    await host.sessions.revert_clear(sid)
    assert tree(repo) == after
    page = await host.sessions.messages(sid, None)
    assert second in [m.id for m in page.data]
    assert (await host.sessions.get(sid)).revert is None
    # Stage again and commit: permanent.
    await host.sessions.revert_stage(sid, RevertStageInput(message_id=second, files=True))
    assert tree(repo) == before_second
    await host.sessions.revert_commit(sid)
    ids = [m.id for m in (await host.sessions.messages(sid, None)).data]
    assert second not in ids
    assert first in ids
    assert (await host.sessions.get(sid)).revert is None
    types = [e.event async for e in host.sessions.log(sid)]
    assert "session.revert.committed" in types  # the log keeps everything


async def test_transcript_only_revert_leaves_files(host: Embedded, repo: Path) -> None:
    sid, _, second = await writing_session(host, repo)
    now = tree(repo)
    revert = await host.sessions.revert_stage(sid, RevertStageInput(message_id=second))
    assert revert.snapshot is None
    assert revert.files is None
    assert tree(repo) == now


async def test_prompt_commits_staged_revert_and_discards_held_synthetic(
    host: Embedded, repo: Path
) -> None:
    sid, _first, second = await writing_session(host, repo)
    await host.sessions.revert_stage(sid, RevertStageInput(message_id=second, files=True))
    held = await host.sessions.synthetic(sid, SyntheticInput(text="held"))
    # Held: recorded but not woken for.
    assert await host.runtime.execution.active() == []
    assert [i.id for i in await host.sessions.inbox(sid)] == [held.id]
    replacement = await host.sessions.prompt(sid, PromptInput(text="instead", resume=False))
    assert [i.id for i in await host.sessions.inbox(sid)] == [replacement.id]
    assert (await host.sessions.get(sid)).revert is None
    types = [e.event async for e in host.sessions.log(sid)]
    i = types.index("session.revert.committed")
    assert types[i - 1] == "session.inbox.cancelled"
    assert types[i + 1] == "session.inbox.enqueued"


async def test_revert_refused_while_running_and_unknown_message(host: Embedded, repo: Path) -> None:
    s = await host.sessions.create(CreateSessionInput(location=Location(directory=str(repo))))
    first = await prompt_and_wait(host, s.id, "#text hi")
    with pytest.raises(MessageNotFoundError):
        await host.sessions.revert_stage(s.id, RevertStageInput(message_id="msg_nope"))
    await host.sessions.prompt(s.id, PromptInput(text="#delay 200\n#text slow"))
    while not await host.runtime.execution.active():
        await host.sessions.get(s.id)
    with pytest.raises(SessionBusyError):
        await host.sessions.revert_stage(s.id, RevertStageInput(message_id=first))
    with pytest.raises(SessionBusyError):
        await host.sessions.revert_clear(s.id)
    with pytest.raises(SessionBusyError):
        await host.sessions.revert_commit(s.id)
    await host.sessions.wait(s.id)


async def test_diff_between_user_messages(host: Embedded, repo: Path) -> None:
    sid, first, second = await writing_session(host, repo)
    diffs = {d.file: d for d in await host.sessions.diff(sid, DiffQuery(from_=second))}
    assert set(diffs) == {"a.txt", "b.txt", "bin.dat", "new/dir/c.txt"}
    assert diffs["a.txt"].status == "modified"
    assert "-alpha" in diffs["a.txt"].patch
    assert "+ALPHA CHANGED" in diffs["a.txt"].patch
    assert diffs["b.txt"].status == "deleted"
    assert diffs["b.txt"].deletions == 1
    assert diffs["new/dir/c.txt"].status == "added"
    assert diffs["new/dir/c.txt"].additions == 1
    assert diffs["bin.dat"].binary
    assert diffs["bin.dat"].patch == ""
    between = await host.sessions.diff(sid, DiffQuery(from_=first, to=second))
    assert [d.file for d in between] == ["b.txt", "bin.dat"]
    # The user's own binary file appeared between the prompts and counts too.
    zero = await host.sessions.diff(sid, DiffQuery(from_=first, to=second, context=0))
    assert zero[0].patch.count("@@") == 2


async def test_shell_changes_are_not_attributed_to_steps(host: Embedded, repo: Path) -> None:
    s = await host.sessions.create(CreateSessionInput(location=Location(directory=str(repo))))
    await host.sessions.shell(s.id, ShellInput(command="echo user > user.txt"))
    await until(host, s.id, "session.shell.ended")
    msg = await prompt_and_wait(
        host, s.id, tool("write", path="x.txt", content="x") + "\n---\n#text"
    )
    await host.sessions.revert_stage(s.id, RevertStageInput(message_id=msg, files=True))
    assert (repo / "user.txt").read_text() == "user\n"
    assert not (repo / "x.txt").exists()


async def test_a_commit_keeps_a_running_shell_which_then_ends_with_its_notice(
    host: Embedded, repo: Path
) -> None:
    sid, _, second = await writing_session(host, repo)
    gate = repo / "go"
    command = "while [ ! -e go ]; do sleep 0.02; done; echo finished"
    await host.sessions.shell(sid, ShellInput(id="msg_liveshell1", command=command))
    await host.sessions.revert_stage(sid, RevertStageInput(message_id=second))
    await host.sessions.revert_commit(sid)
    page = await host.sessions.messages(sid, None)
    assert [m.id for m in page.data if m.type == "shell"] == ["msg_liveshell1"]
    gate.write_text("")
    (ended,) = await until(host, sid, "session.shell.ended")
    assert ended["output"] == "finished\n"
    page = await host.sessions.messages(sid, None)
    [shell] = [m for m in page.data if m.type == "shell"]
    assert shell.shell.state == "completed"
    assert [i.id for i in await host.sessions.inbox(sid)] == ["msg_liveshell1n"]
    stored, rebuilt = await stored_and_rebuilt(host.runtime.store)
    assert stored == rebuilt


async def test_replay_rebuilds_shell_and_revert_projections(tmp_path: Path, repo: Path) -> None:
    async with Embedded(tmp_path / "data") as oc:
        sid, _, second = await writing_session(oc, repo)
        # Removed from the projection by the commit below (it came after ``second``).
        await oc.sessions.shell(sid, ShellInput(command="echo gone"))
        await until(oc, sid, "session.shell.ended")
        await oc.sessions.revert_stage(sid, RevertStageInput(message_id=second, files=True))
        await oc.sessions.synthetic(sid, SyntheticInput(text="held"))
        await oc.sessions.revert_commit(sid)
        other, _, third = await writing_session(oc, repo)
        await oc.sessions.shell(other, ShellInput(command="echo kept"))
        await until(oc, other, "session.shell.ended")
        await oc.sessions.revert_stage(other, RevertStageInput(message_id=third))
        store = oc.runtime.store
    stored, rebuilt = await stored_and_rebuilt(store)
    assert stored == rebuilt
    shells = [row for row in stored["session_message"] if row[2] == "shell"]  # type: ignore[index]
    assert len(shells) == 1
    assert "kept" in shells[0][6]


class Crash(Exception):
    """Stands for the process dying at the point it is raised."""


async def test_a_crash_in_the_middle_of_the_restore_is_undone_at_restart(
    tmp_path: Path, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The files change before the stage is recorded: a crash among them is put back."""
    async with Embedded(tmp_path / "data") as oc:
        sid, _, second = await writing_session(oc, repo)
        changed = tree(repo)
        snapshots = oc.runtime.services.snapshots
        real = snapshots.restore

        async def half_then_crash(directory: Any, restores: Any, **kw: Any) -> None:
            tree_id, paths = restores[0]
            await real(directory, [(tree_id, paths[:1])], **kw)
            raise Crash

        monkeypatch.setattr(snapshots, "restore", half_then_crash)
        with pytest.raises(Crash):  # the runtime's own call: over HTTP it would be a 500
            await oc.runtime.reverts.stage(sid, second, files=True)
        half = tree(repo)
        assert half != changed
        assert (tmp_path / "data" / "revert" / f"{sid}.json").exists()
    async with Embedded(tmp_path / "data") as oc:
        # The log has no stage, so recovery put the files back: they agree.
        assert (await oc.sessions.get(sid)).revert is None
        assert tree(repo) == changed
        assert not (tmp_path / "data" / "revert" / f"{sid}.json").exists()
        staged = await oc.sessions.revert_stage(
            sid, RevertStageInput(message_id=second, files=True)
        )
        assert staged.files
        restored = tree(repo)
        assert restored["a.txt"] == b"alpha\n"
        assert restored["b.txt"] == b"bravo\n"
        assert restored["bin.dat"] == BINARY
        assert "new/dir/c.txt" not in restored
        assert restored["ignored.log"] == b"noise\n"
        await oc.sessions.revert_clear(sid)
        assert tree(repo) == changed


async def test_a_crash_before_the_stage_commits_puts_the_files_back_at_restart(
    tmp_path: Path, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with Embedded(tmp_path / "data") as oc:
        sid, _, second = await writing_session(oc, repo)
        changed = tree(repo)

        async def crash(*args: Any) -> Any:
            raise Crash

        monkeypatch.setattr(oc.runtime.reverts, "_append", crash)
        monkeypatch.setattr(oc.runtime.reverts, "_recorded", crash)
        with pytest.raises(Crash):  # the runtime's own call: over HTTP it would be a 500
            await oc.runtime.reverts.stage(sid, second, files=True)
        assert (tmp_path / "data" / "revert" / f"{sid}.json").exists()
        assert tree(repo) != changed  # restored, the event not recorded
    async with Embedded(tmp_path / "data") as oc:
        assert (await oc.sessions.get(sid)).revert is None
        assert tree(repo) == changed
        assert not (tmp_path / "data" / "revert" / f"{sid}.json").exists()


async def test_a_clear_whose_event_is_refused_puts_the_files_back_at_once(
    tmp_path: Path, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with Embedded(tmp_path / "data") as oc:
        sid, _, second = await writing_session(oc, repo)
        changed = tree(repo)
        await oc.sessions.revert_stage(sid, RevertStageInput(message_id=second, files=True))
        staged = tree(repo)

        async def crash(*args: Any) -> None:
            raise Crash

        monkeypatch.setattr(oc.runtime.reverts, "_append", crash)
        with pytest.raises(Crash):
            await oc.runtime.reverts.clear(sid)
        # The log says still staged: the files the clear had brought back went again.
        assert tree(repo) == staged
        assert not (tmp_path / "data" / "revert" / f"{sid}.json").exists()
    async with Embedded(tmp_path / "data") as oc:
        assert (await oc.sessions.get(sid)).revert is not None
        assert tree(repo) == staged
        await oc.sessions.revert_clear(sid)
        assert tree(repo) == changed


async def test_a_file_goes_back_to_how_it_was_just_before_the_agent_changed_it(
    host: Embedded, repo: Path
) -> None:
    s = await host.sessions.create(CreateSessionInput(location=Location(directory=str(repo))))
    await prompt_and_wait(
        host, s.id, tool("write", path="a.txt", content="agent 1\n") + "\n---\n#t"
    )
    # The user edits outside the agent: no step sees it until one writes the file.
    (repo / "a.txt").write_text("the user's\n")
    (repo / "keep.txt").write_text("the user's too\n")
    msg = await prompt_and_wait(
        host,
        s.id,
        tool("write", path="a.txt", content="agent 2\n")
        + "\n"
        + tool("bash", command="echo agent > keep.txt")
        + "\n---\n#t",
    )
    (ended,) = [
        e.data["data"]
        async for e in host.sessions.log(s.id)
        if e.event == "session.step.ended" and e.data["data"].get("files") == ["a.txt", "keep.txt"]
    ]
    assert ended["before"] != ended["snapshot"]
    await host.sessions.revert_stage(s.id, RevertStageInput(message_id=msg, files=True))
    assert (repo / "a.txt").read_text() == "the user's\n"
    assert (repo / "keep.txt").read_text() == "the user's too\n"


async def test_step_writes_name_odd_paths_and_leave_ignored_and_outside_ones(
    tmp_path: Path, repo: Path
) -> None:
    from actors.files.snapshots import Snapshots, StepWrites

    store = Snapshots(tmp_path / "store")
    odd = ["it's.txt", "two\nlines.txt", "sp ace/é.txt"]
    writes = StepWrites(store, str(repo))
    for name in [*odd, "x.log", "../outside.txt", str(repo / "a.txt")]:
        await writes.before_run("write", {"path": name})
    for name in odd:
        (repo / name).parent.mkdir(exist_ok=True)
        (repo / name).write_text(name)
    (repo / "x.log").write_text("ignored\n")
    (repo / "a.txt").write_text("changed\n")
    recorded = await writes.record()
    assert recorded is not None
    # A newline in a name makes git's verbose lines ambiguous: the diff answers then.
    assert recorded.files == tuple(sorted([*odd, "a.txt"]))
    assert await store.changed(repo, recorded.before, recorded.after) == recorded.files
    await store.restore(repo, [(recorded.before, recorded.files)])
    assert not any((repo / name).exists() for name in odd)
    assert (repo / "a.txt").read_text() == "alpha\n"
    assert (repo / "x.log").read_text() == "ignored\n"
    # Nothing changed since: no git runs for the next step's trees.
    again = StepWrites(store, str(repo))
    await again.before_run("edit", {"path": "a.txt"})
    unchanged = await again.record()
    assert unchanged is not None
    assert unchanged.files == ()
    assert unchanged.before == unchanged.after == recorded.before
    await store.aclose()


async def test_a_prompt_reads_the_session_only_when_a_revert_is_staged(
    host: Embedded, repo: Path
) -> None:
    """The admission goes first with a no-staged-revert check; only its refusal reads."""
    sid, _first, second = await writing_session(host, repo)
    queries = host.runtime.store.queries
    real, reads = queries.session, []

    async def counting(session_id: str) -> Any:
        reads.append(session_id)
        return await real(session_id)

    queries.session = counting  # type: ignore[method-assign]
    await host.sessions.prompt(sid, PromptInput(text="plain", resume=False))
    assert reads == []
    queries.session = real  # type: ignore[method-assign]
    await host.sessions.revert_stage(sid, RevertStageInput(message_id=second, files=True))
    queries.session = counting  # type: ignore[method-assign]
    await host.sessions.prompt(sid, PromptInput(text="instead", resume=False))
    assert reads == [sid]
    assert (await host.sessions.get(sid)).revert is None


async def test_a_diff_takes_only_tree_ids_never_options(
    host: Embedded, repo: Path, tmp_path: Path
) -> None:
    """What a diff hands git are tree ids of the store: an option-like value is refused first."""
    snapshots = host.runtime.services.snapshots
    tree_id = await snapshots.track(repo)
    assert tree_id is not None
    out = tmp_path / "written-by-git"
    for forged in (f"--output={out}", "HEAD", "a" * 39, tree_id.upper()):
        with pytest.raises(SnapshotError):
            await snapshots.diff(repo, forged, tree_id)
        with pytest.raises(SnapshotError):
            await snapshots.diff(repo, tree_id, forged)
        assert not await snapshots.has_trees(repo, [forged])
    assert not out.exists()
    assert await snapshots.has_trees(repo, [tree_id])
    assert await snapshots.diff(repo, tree_id, tree_id) == []


async def test_a_stage_whose_caller_is_gone_holds_the_session_until_its_restore_ends(
    tmp_path: Path, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The restore outlives a cancelled call, and so does its hold on the session.

    Found by crashsim: a stage whose caller went away (a timeout, a disconnect)
    mid-restore let go of the session while its restore went on, so a prompt
    committed the revert with the files half restored, and a kill then left
    them so. The test hook pauses the stage with one path back; its caller is
    cancelled; a command for the session sent after that has not run once the
    loop has settled (it would have at once, in the loop's turns alone, had the
    session been let go), and it runs when the restore is over, finding every
    file back. What a kill there leaves after a restart is
    tests/durability/test_revert_crash.py's ``stage.restore`` case.
    """
    marker = tmp_path / "paused"
    monkeypatch.setenv(PAUSE_ENV, f"stage.restore:{marker}")
    async with Embedded(tmp_path / "data") as host:
        try:
            sid, _, second = await writing_session(host, repo)
            stage = asyncio.ensure_future(
                host.sessions.revert_stage(sid, RevertStageInput(message_id=second, files=True))
            )
            async with asyncio.timeout(60):  # a guard, never the assertion
                while not marker.exists():
                    assert not stage.done(), f"the stage ended without pausing: {stage}"
                    await asyncio.sleep(0.01)
            half = tree(repo)
            assert "new/dir/c.txt" not in half  # one path back (the new file gone)...
            assert half["a.txt"] == b"ALPHA CHANGED\n"  # ...the others not
            stage.cancel()  # its caller goes
            with contextlib.suppress(asyncio.CancelledError):
                await stage
            found: list[dict[str, bytes]] = []

            async def next_command(_: object) -> None:
                found.append(tree(repo))

            command = asyncio.ensure_future(host.runtime.execution.command(sid, next_command))
            await quiesce()
            assert (found, command.done()) == ([], False)  # held behind the restore
            host.runtime.reverts.resume_paused()
            await command
            [seen] = found
            assert (seen["a.txt"], seen["b.txt"]) == (b"alpha\n", b"bravo\n")
            assert "new/dir/c.txt" not in seen
            assert seen == tree(repo)
            session = await host.sessions.get(sid)
            assert session.revert is not None
            assert session.revert.message_id == second
        finally:  # a failure above leaves the stage paused: let it end, so the host can close
            host.runtime.reverts.resume_paused()
