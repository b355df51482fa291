"""SIGKILL a real ``sessionrt serve`` inside a revert's stage, clear or commit.

The server runs on SQLite over a real git project whose files the scripted
model changed over three prompts (an edit, a deleted file, a new file in a
new directory, a binary file, a .gitignored file). The revert test hook
(``actors.session.revert.PAUSE_ENV``) stops the revert at an exact point: the intent
durable but its event not appended; the event committed but no file back; one
path restored and the others not; a commit's events committed. There the
process is killed. After a restart the files are byte for byte the state
before the operation or the state after it (which one the log says), never a
mix; the intent is consumed; a second restart changes nothing; and the
session takes a new prompt, which commits a revert left staged.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from serve_proc import serving

from actors.session.revert import PAUSE_ENV
from protocol.client import Client, ClientError
from protocol.operations import LogQuery, RevertStageInput
from protocol.requests import CreateSessionInput, PromptInput
from protocol.shapes import Location, SessionRevert
from tests.shell.conftest import git, tool, tree

#: Real servers started and killed: first, so they do not end the run alone.
pytestmark = pytest.mark.slow

GUARD = 60.0
DEVNULL = asyncio.subprocess.DEVNULL
BINARY = bytes(range(256)) * 3
IGNORED = ("ignored.log", "cache/state.bin")

Tree = dict[str, bytes]
Call = Callable[[Client], Awaitable[Any]]


def _script(*calls: str) -> str:
    return "\n".join([*calls, "---", "#text done"])


def _printf(data: bytes) -> str:
    """A ``printf`` format that writes ``data`` exactly (octal escapes)."""
    return "".join(f"\\{b:03o}" for b in data)


#: Three prompts; each line is one step's tool calls (then a closing text step).
PROMPTS = (
    _script(
        tool("write", path="b.txt", content="bravo\n"),
        tool("bash", command="rm gone.txt && echo 1 > ignored.log"),
    ),
    _script(
        tool("edit", path="a.txt", old_string="alpha", new_string="ALPHA"),
        tool("write", path="new/dir/c.txt", content="charlie\n"),
        tool(
            "bash",
            command=f"printf '{_printf(BINARY)}' > bin.dat && echo 2 >> ignored.log"
            " && mkdir -p cache && printf '\\000\\001' > cache/state.bin",
        ),
    ),
    _script(
        tool("edit", path="a.txt", old_string="ALPHA", new_string="ALPHA again"),
        tool("bash", command="rm b.txt && echo 3 >> ignored.log"),
    ),
)


def _project(path: Path) -> None:
    path.mkdir()
    git(path, "init", "-q")
    (path / ".gitignore").write_text("*.log\ncache/\n")
    (path / "a.txt").write_text("alpha\n")
    (path / "gone.txt").write_text("to be deleted\n")
    (path / "bin.dat").write_bytes(b"\x00old\xff")
    (path / "keep.txt").write_text("untouched\n")
    git(path, "add", "-A")
    git(path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")


def _ignored(path: str) -> bool:
    return path in IGNORED


def _reverted(before: Tree, now: Tree) -> Tree:
    """``now`` with every tracked file as in ``before``; ignored files left as they are now."""
    return {k: v for k, v in before.items() if not _ignored(k)} | {
        k: v for k, v in now.items() if _ignored(k)
    }


class Run:
    """One session's project, its trees at each prompt, and the server's data dir."""

    def __init__(self, tmp: Path, *, fresh: bool = True) -> None:
        self.home = tmp
        self.data, self.project = tmp / "data", tmp / "project"
        self.marker = tmp / "paused"
        self.session = ""
        self.users: list[str] = []
        self.trees: list[Tree] = []
        if fresh:
            self.data.mkdir(mode=0o700)
            _project(self.project)
            self.trees.append(tree(self.project))

    def env(self, point: str | None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != PAUSE_ENV}
        if point is not None:
            env[PAUSE_ENV] = f"{point}:{self.marker}"
        return env

    def intents(self) -> list[str]:
        folder = self.data / "revert"
        return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


async def _write_three_prompts(run: Run, client: Client) -> None:
    session = await client.sessions.create(
        CreateSessionInput(location=Location(directory=str(run.project)))
    )
    run.session = session.id
    for text in PROMPTS:
        receipt = await client.sessions.prompt(session.id, PromptInput(text=text))
        await client.sessions.wait(session.id)
        run.users.append(receipt.id)
        run.trees.append(tree(run.project))
    _, t1, t2, t3 = run.trees
    # The script did what the assertions below rely on.
    assert (t1["b.txt"], "gone.txt" in t1) == (b"bravo\n", False)
    assert (t2["bin.dat"], t2["new/dir/c.txt"]) == (BINARY, b"charlie\n")
    assert (t3["a.txt"], "b.txt" in t3) == (b"ALPHA again\n", False)
    assert (t3["ignored.log"], t3["cache/state.bin"]) == (b"1\n2\n3\n", b"\x00\x01")


# -- the three prompts, written once per worker ----------------------------------------------
# Every case starts from the same history: a server that ran the three prompts (and,
# for all but a killed stage, staged a revert at the second) and stopped cleanly.
# That history is made once per test process and copied back before each case,
# to the same paths (the log names the project's absolute path), instead of one
# more server start and three prompts per case. The group keeps the cases on one
# xdist worker.

#: what a prepared history left: the copy, and the session, user messages and trees.
_PREPARED: dict[bool, tuple[Path, str, list[str], list[Tree]]] = {}


def _restore(home: Path, copy: Path) -> None:
    shutil.rmtree(home, ignore_errors=True)
    shutil.copytree(copy, home, symlinks=True)


async def _prepared(factory: pytest.TempPathFactory, *, staged: bool) -> Run:
    """A run at ``<basetemp>/revert-crash`` after the three prompts (the second's
    revert staged when ``staged``), the server stopped; made the first time only."""
    home = factory.getbasetemp() / "revert-crash"
    if staged not in _PREPARED:
        if staged:
            run = await _prepared(factory, staged=False)
            async with serving(run.data, env=run.env(None), stderr=DEVNULL) as served:
                async with Client(served.url) as client:
                    second = RevertStageInput(message_id=run.users[1], files=True)
                    await client.sessions.revert_stage(run.session, second)
                await _stop(served)
        else:
            shutil.rmtree(home, ignore_errors=True)
            home.mkdir()
            run = Run(home)
            async with serving(run.data, env=run.env(None), stderr=DEVNULL) as served:
                async with Client(served.url) as client:
                    await _write_three_prompts(run, client)
                await _stop(served)
        copy = factory.getbasetemp() / f"revert-crash-{'staged' if staged else 'written'}"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(home, copy, symlinks=True)
        _PREPARED[staged] = (copy, run.session, list(run.users), list(run.trees))
    copy, session, users, trees = _PREPARED[staged]
    _restore(home, copy)
    run = Run(home, fresh=False)
    run.session, run.users, run.trees = session, list(users), list(trees)
    return run


async def _until_paused(run: Run, call: asyncio.Future[Any]) -> str:
    async with asyncio.timeout(GUARD):  # a guard, never the assertion
        while not run.marker.exists():
            assert not call.done(), f"the call ended without pausing: {call}"
            await asyncio.sleep(0.02)
    return run.marker.read_text()


async def _kill_inside(
    run: Run, served: Any, point: str, operation: Callable[[], Awaitable[Any]]
) -> Tree:
    """Run ``operation`` until the hook pauses it at ``point``; SIGKILL; the tree then."""
    call = asyncio.ensure_future(operation())
    try:
        assert await _until_paused(run, call) == point
        at_kill = tree(run.project)
        served.proc.send_signal(signal.SIGKILL)
        await served.proc.wait()
    finally:
        with contextlib.suppress(ClientError, asyncio.CancelledError):
            call.cancel()
            await call
    assert served.proc.returncode == -signal.SIGKILL
    return at_kill


async def _state(client: Client, session_id: str) -> tuple[SessionRevert | None, list[str]]:
    session = await client.sessions.get(session_id)
    page = await client.sessions.messages(session_id)
    return session.revert, [m.id for m in page.data]


async def _revert_events(client: Client, session_id: str) -> list[str]:
    return [
        e.event
        async for e in client.sessions.log(session_id, LogQuery())
        if e.event.startswith("session.revert.")
    ]


#: case -> (the operation killed, the files after the restart: its state "before" or
#: "after" it, or "cleared" (t3: a restage's clear went through, its stage did not),
#: the user message (by index) a revert is staged at after the restart, or None).
#: The files change before the event is appended: killed before the event, the
#: restart puts them back; killed after it, they are already what the log says.
CASES: dict[str, tuple[str, str, int | None]] = {
    "stage.intent": ("stage", "before", None),
    "stage.restore": ("stage", "before", None),
    "stage.event": ("stage", "after", 1),
    "clear.intent": ("clear", "before", 1),
    "clear.restore": ("clear", "before", 1),
    "clear.event": ("clear", "after", None),
    "commit": ("commit", "after", None),
    # Staging at the third prompt over the one staged at the second first clears
    # it, as its own durable step: killed in that clear, then in the stage.
    "restage.clear.restore": ("restage", "before", 1),
    "restage.stage.restore": ("restage", "cleared", None),
}


@pytest.mark.slow
@pytest.mark.xdist_group("revert-crash")
@pytest.mark.parametrize("case", sorted(CASES))
async def test_a_revert_killed_at_any_point_leaves_files_and_log_agreeing(
    tmp_path_factory: pytest.TempPathFactory, case: str
) -> None:
    op, outcome, staged_at = CASES[case]
    point = case.removeprefix("restage.")
    # A server without the hook wrote the files and staged what the killed call needs.
    run = await _prepared(tmp_path_factory, staged=op != "stage")
    second = RevertStageInput(message_id=run.users[1], files=True)
    _, t1, t2, t3 = run.trees
    # Back to before the second (third) prompt: the files prompts 2 and 3 (3) changed.
    staged2, staged3 = _reverted(t1, t3), _reverted(t2, t3)
    sid, third = run.session, RevertStageInput(message_id=run.users[2], files=True)
    calls: dict[str, tuple[Tree, Tree, Call]] = {
        "stage": (t3, staged2, lambda c: c.sessions.revert_stage(sid, second)),
        "clear": (staged2, t3, lambda c: c.sessions.revert_clear(sid)),
        "commit": (staged2, staged2, lambda c: c.sessions.revert_commit(sid)),
        "restage": (
            staged2,
            t3 if point.startswith("clear.") else staged3,
            lambda c: c.sessions.revert_stage(sid, third),
        ),
    }
    before, after, call = calls[op]
    assert tree(run.project) == before
    # The killed call, on a server with the hook set at ``point``.
    async with (
        serving(run.data, env=run.env(point), stderr=DEVNULL) as served,
        Client(served.url) as client,
    ):
        at_kill = await _kill_inside(run, served, point, lambda: call(client))
    if point.endswith(".restore"):
        # Killed mid-restore: the files really were a mix of both states.
        assert at_kill not in (before, after)
    else:
        assert at_kill == (after if point.endswith(".event") else before)
    # Killed with its intent on disk (a commit touches no file and writes none).
    assert bool(run.intents()) == (op != "commit")

    expected = {"before": before, "after": after, "cleared": t3}[outcome]
    async with serving(run.data, env=run.env(None), stderr=DEVNULL) as served:
        async with Client(served.url) as client:
            assert tree(run.project) == expected  # byte for byte, never a mix
            assert run.intents() == []
            revert, shown = await _state(client, run.session)
            events = await _revert_events(client, run.session)
        await _stop(served)
    # The revert state and transcript agree with the files found.
    assert ("session.revert.committed" in events) == (op == "commit")
    visible = [u for u in run.users if u in shown]
    if op == "commit":
        assert revert is None
        assert visible == run.users[:1]
    elif staged_at is None:
        assert revert is None
        assert visible == run.users
    else:
        assert revert is not None
        assert revert.message_id == run.users[staged_at]
        assert revert.files  # a files revert, with the tree a clear goes back to
        assert visible == run.users[:staged_at]

    async with (
        serving(run.data, env=run.env(None), stderr=DEVNULL) as served,
        Client(served.url) as client,
    ):
        # A second restart finds nothing to finish: nothing changes.
        assert tree(run.project) == expected
        assert run.intents() == []
        assert await _state(client, run.session) == (revert, shown)
        assert await _revert_events(client, run.session) == events
        # The session takes a new prompt; it commits a revert left staged.
        text = _script(tool("write", path="after.txt", content="after the crash\n"))
        receipt = await client.sessions.prompt(run.session, PromptInput(text=text))
        await client.sessions.wait(run.session)
        assert tree(run.project) == expected | {"after.txt": b"after the crash\n"}
        now, ids = await _state(client, run.session)
        assert now is None
        # What was shown stays; what a staged revert hid is gone for good.
        assert [u for u in run.users if u in ids] == visible
        assert receipt.id in ids
        # Its snapshot names the one file it wrote (the store's index agrees with the
        # files the recovery left), and reverting it removes exactly that file.
        assert (await _step_files(client, run.session))[-1] == ["after.txt"]
        new = RevertStageInput(message_id=receipt.id, files=True)
        await client.sessions.revert_stage(run.session, new)
        assert tree(run.project) == expected
        await client.sessions.revert_clear(run.session)
        assert tree(run.project) == expected | {"after.txt": b"after the crash\n"}


async def _step_files(client: Client, session_id: str) -> list[list[str]]:
    """The ``files`` of every step that recorded a snapshot, in order."""
    return [
        e.data["data"]["files"]
        async for e in client.sessions.log(session_id, LogQuery())
        if e.event == "session.step.ended" and e.data["data"].get("snapshot")
    ]


async def _stop(served: Any) -> None:
    served.proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(served.proc.wait(), GUARD) == 0


async def test_an_intent_torn_by_a_kill_while_written_is_removed_at_start(tmp_path: Path) -> None:
    """A kill inside the intent's write leaves its temporary file: never an intent."""
    run = Run(tmp_path)
    async with serving(run.data, env=run.env(None), stderr=DEVNULL) as served:
        await _stop(served)
    folder = run.data / "revert"
    folder.mkdir(exist_ok=True)
    # As _write_durably leaves it when killed before its rename: the event never came.
    (folder / "ses_torn0000000000000000000000.tmp").write_bytes(b'{"op": "stage", "sess')
    async with serving(run.data, env=run.env(None), stderr=DEVNULL) as served:
        assert run.intents() == []
        await _stop(served)
