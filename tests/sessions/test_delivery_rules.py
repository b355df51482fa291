"""The delivery rules at a boundary, over the embedded host's HTTP app.

Each test here was a bug on 8605a2b (issue 37): a queued control item with a
steer behind it (a prompt, a shell's completion notice, the restart notice)
stalled the session forever; synthetic input held behind a
staged revert was delivered by any other wake; a second cancel of the same
item was a conflict where the reference answers it like the first.

Two more were bugs on 26ef030 (found writing the delivery state machine): a
steer behind a queued control item on an idle session stayed pending when
the steer came from a delivery change, or from an interrupt that resumes
(a wake at steer scope parked the control item, and the steer with it).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from protocol.operations import (
    DeliveryInput,
    InterruptQuery,
    LogQuery,
    RevertStageInput,
    ShellInput,
)
from protocol.requests import (
    CompactInput,
    CreateSessionInput,
    MoveInput,
    PromptInput,
    SyntheticInput,
)
from protocol.shapes import Location
from server.embedded import Embedded

SLOW = "#delay 100\n#chunk 2\n#text a slow second answer"
#: A turn whose tool runs until the test creates ``go`` in the session's directory.
BLOCKED = (
    '#tool bash {"command": "until [ -e go ]; do sleep 0.02; done"}\n#step\n#text the tool returned'
)


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[Embedded]:
    async with Embedded(tmp_path / "data") as oc:
        yield oc


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    path.mkdir()
    return path


async def log_of(oc: Embedded, session_id: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        (e.event, e.data["data"]) async for e in oc.sessions.log(session_id) if "data" in e.data
    ]


async def delivered(oc: Embedded, session_id: str) -> list[str]:
    return [d["inboxID"] for t, d in await log_of(oc, session_id) if t == "session.inbox.delivered"]


async def streaming(oc: Embedded, session_id: str, text: str) -> None:
    """Admit ``text`` and return once its answer's first text streams (the step runs)."""
    async with asyncio.timeout(30):
        follow = oc.sessions.log(session_id, LogQuery(follow=True))
        await oc.sessions.prompt(session_id, PromptInput(text=text))
        async for e in follow:
            if e.event == "session.text.started" and e.data["data"].get("sessionID") == session_id:
                # Count only this prompt's answer: the first prompt's ended before.
                answers = sum(t == "session.text.started" for t, _ in await log_of(oc, session_id))
                if answers >= 2:
                    return
    raise AssertionError("the slow answer never streamed")


async def test_a_queued_compaction_then_a_steer_both_deliver(host: Embedded, workdir: Path) -> None:
    s = await host.sessions.create(CreateSessionInput(location=Location(directory=str(workdir))))
    await host.sessions.prompt(s.id, PromptInput(text="first"))
    await host.sessions.wait(s.id)
    await streaming(host, s.id, SLOW)
    compaction = await host.sessions.compact(s.id, CompactInput(delivery="queue"))
    steer = await host.sessions.prompt(s.id, PromptInput(text="a steer"))
    await host.sessions.wait(s.id)
    # The control item is a boundary the steer does not cross; at the idle
    # boundary nothing is ahead of it, so it delivers, then the steer.
    assert list(await host.sessions.inbox(s.id)) == []
    assert (await delivered(host, s.id))[-2:] == [compaction.id, steer.id]


async def test_a_queued_move_then_a_steer_both_deliver(
    host: Embedded, workdir: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    s = await host.sessions.create(CreateSessionInput(location=Location(directory=str(workdir))))
    await host.sessions.prompt(s.id, PromptInput(text="first"))
    await host.sessions.wait(s.id)
    await streaming(host, s.id, SLOW)
    await host.sessions.move(s.id, MoveInput(directory=str(elsewhere), delivery="queue"))
    steer = await host.sessions.prompt(s.id, PromptInput(text="a steer"))
    await host.sessions.wait(s.id)
    assert list(await host.sessions.inbox(s.id)) == []
    assert (await host.sessions.get(s.id)).location.directory == str(elsewhere)
    events = await log_of(host, s.id)
    moved = next(i for i, (t, _) in enumerate(events) if t == "session.moved")
    steered = next(
        i
        for i, (t, d) in enumerate(events)
        if t == "session.inbox.delivered" and d["inboxID"] == steer.id
    )
    assert moved < steered


async def until(oc: Embedded, session_id: str, event: str) -> dict[str, Any]:
    """The data of the session's first durable ``event``, waiting for it if need be."""
    async with asyncio.timeout(30):
        async for e in oc.sessions.log(session_id, LogQuery(follow=True)):
            if e.event == event and "data" in e.data:
                data: dict[str, Any] = e.data["data"]
                return data
    raise AssertionError(f"{event} never came")


async def notices(oc: Embedded, session_id: str) -> list[tuple[str, dict[str, Any]]]:
    """(inbox id, metadata) of each synthetic admission, in log order."""
    return [
        (d["inboxID"], d["item"]["payload"].get("metadata", {}))
        for t, d in await log_of(oc, session_id)
        if t == "session.inbox.enqueued" and d["item"]["type"] == "synthetic"
    ]


async def test_a_queued_compaction_then_a_shell_notice_both_deliver(
    host: Embedded, workdir: Path
) -> None:
    s = await host.sessions.create(CreateSessionInput(location=Location(directory=str(workdir))))
    await host.sessions.prompt(s.id, PromptInput(text="first"))
    await host.sessions.wait(s.id)
    await host.sessions.prompt(s.id, PromptInput(text=BLOCKED))
    await until(host, s.id, "session.tool.spawned")
    compaction = await host.sessions.compact(s.id, CompactInput(delivery="queue"))
    # The shell ends while the turn's tool still runs: its completion notice is
    # a steer (admitted without a wake) behind the queued compaction.
    await host.sessions.shell(s.id, ShellInput(command="echo from the shell"))
    await until(host, s.id, "session.shell.ended")
    [(notice, metadata)] = await notices(host, s.id)
    assert metadata["source"] == "shell"
    (workdir / "go").touch()
    await host.sessions.wait(s.id)
    # The steer does not cross the control item; at the idle boundary nothing
    # is ahead of it, so it delivers, then the notice.
    assert list(await host.sessions.inbox(s.id)) == []
    assert (await delivered(host, s.id))[-2:] == [compaction.id, notice]


async def test_a_queued_compaction_then_the_restart_notice_both_deliver(
    tmp_path: Path, workdir: Path
) -> None:
    async with Embedded(tmp_path / "data") as first:
        s = await first.sessions.create(
            CreateSessionInput(location=Location(directory=str(workdir)))
        )
        await first.sessions.prompt(s.id, PromptInput(text="first"))
        await first.sessions.wait(s.id)
        await first.sessions.prompt(s.id, PromptInput(text=BLOCKED))
        await until(first, s.id, "session.tool.spawned")
        compaction = await first.sessions.compact(s.id, CompactInput(delivery="queue"))
    # The shutdown cut the turn short and kept its claim: the next start admits
    # the restart notice (a steer, behind the queued compaction) and wakes it.
    async with Embedded(tmp_path / "data") as second:
        await second.sessions.wait(s.id)
        [(notice, metadata)] = await notices(second, s.id)
        assert metadata["notice"] == "restart"
        assert list(await second.sessions.inbox(s.id)) == []
        assert (await delivered(second, s.id))[-2:] == [compaction.id, notice]


async def staged(oc: Embedded, workdir: Path) -> tuple[str, str]:
    """A session with two answered prompts and a revert staged to the second."""
    s = await oc.sessions.create(CreateSessionInput(location=Location(directory=str(workdir))))
    await oc.sessions.prompt(s.id, PromptInput(text="#text one"))
    await oc.sessions.wait(s.id)
    second = await oc.sessions.prompt(s.id, PromptInput(text="#text two"))
    await oc.sessions.wait(s.id)
    await oc.sessions.revert_stage(s.id, RevertStageInput(message_id=second.id))
    return s.id, second.id


async def test_held_synthetic_is_not_delivered_by_a_resume(host: Embedded, workdir: Path) -> None:
    sid, _ = await staged(host, workdir)
    before = await log_of(host, sid)
    held = await host.sessions.synthetic(sid, SyntheticInput(text="held"))
    await host.sessions.resume(sid)
    assert [i.id for i in await host.sessions.inbox(sid)] == [held.id]
    after = [t for t, _ in await log_of(host, sid)][len(before) :]
    assert "session.inbox.delivered" not in after
    assert "session.step.started" not in after


async def test_held_synthetic_is_not_delivered_by_steering_it(
    host: Embedded, workdir: Path
) -> None:
    sid, _ = await staged(host, workdir)
    before = await log_of(host, sid)
    held = await host.sessions.synthetic(sid, SyntheticInput(text="held", delivery="queue"))
    await host.sessions.change_delivery(sid, held.id, DeliveryInput(delivery="steer"))
    await host.sessions.wait(sid)
    assert [i.id for i in await host.sessions.inbox(sid)] == [held.id]
    after = [t for t, _ in await log_of(host, sid)][len(before) :]
    assert "session.inbox.delivered" not in after
    assert "session.step.started" not in after


async def test_held_synthetic_delivers_once_the_revert_is_cleared(
    host: Embedded, workdir: Path
) -> None:
    sid, _ = await staged(host, workdir)
    held = await host.sessions.synthetic(sid, SyntheticInput(text="held"))
    await host.sessions.revert_clear(sid)
    await host.sessions.wait(sid)
    assert list(await host.sessions.inbox(sid)) == []
    assert (await delivered(host, sid))[-1] == held.id


async def test_held_synthetic_is_discarded_by_a_commit(host: Embedded, workdir: Path) -> None:
    sid, _ = await staged(host, workdir)
    held = await host.sessions.synthetic(sid, SyntheticInput(text="held"))
    await host.sessions.revert_commit(sid)
    await host.sessions.resume(sid)
    assert list(await host.sessions.inbox(sid)) == []
    events = await log_of(host, sid)
    assert ("session.inbox.cancelled", {"sessionID": sid, "inboxID": held.id}) in events
    assert held.id not in await delivered(host, sid)


async def test_a_second_cancel_is_answered_like_the_first(host: Embedded, workdir: Path) -> None:
    s = await host.sessions.create(CreateSessionInput(location=Location(directory=str(workdir))))
    item = await host.sessions.prompt(s.id, PromptInput(text="later", resume=False))
    await host.sessions.cancel(s.id, item.id)
    await host.sessions.cancel(s.id, item.id)
    events = [t for t, _ in await log_of(host, s.id)]
    assert events.count("session.inbox.cancelled") == 1
    assert list(await host.sessions.inbox(s.id)) == []


async def test_a_steer_change_behind_a_queued_compaction_delivers_both(
    host: Embedded, workdir: Path
) -> None:
    s = await host.sessions.create(CreateSessionInput(location=Location(directory=str(workdir))))
    await host.sessions.prompt(s.id, PromptInput(text="first"))
    await host.sessions.wait(s.id)
    await host.sessions.prompt(s.id, PromptInput(text=BLOCKED))
    await until(host, s.id, "session.tool.spawned")
    compaction = await host.sessions.compact(s.id, CompactInput(delivery="queue"))
    note = await host.sessions.synthetic(
        s.id, SyntheticInput(text="later", delivery="queue", resume=False)
    )
    await host.sessions.interrupt(s.id)
    await host.sessions.wait(s.id)
    assert [i.id for i in await host.sessions.inbox(s.id)] == [compaction.id, note.id]
    # Steering rings the doorbell of an idle session: its first boundary is an
    # idle one, where the queued compaction (nothing ahead) delivers, then the steer.
    await host.sessions.change_delivery(s.id, note.id, DeliveryInput(delivery="steer"))
    await host.sessions.wait(s.id)
    assert list(await host.sessions.inbox(s.id)) == []
    assert (await delivered(host, s.id))[-2:] == [compaction.id, note.id]


async def test_an_interrupt_that_resumes_delivers_a_queued_compaction_then_the_steer(
    host: Embedded, workdir: Path
) -> None:
    s = await host.sessions.create(CreateSessionInput(location=Location(directory=str(workdir))))
    await host.sessions.prompt(s.id, PromptInput(text="first"))
    await host.sessions.wait(s.id)
    await host.sessions.prompt(s.id, PromptInput(text=BLOCKED))
    await until(host, s.id, "session.tool.spawned")
    compaction = await host.sessions.compact(s.id, CompactInput(delivery="queue"))
    note = await host.sessions.synthetic(s.id, SyntheticInput(text="a note", resume=False))
    # Resuming wakes for a steer: the compaction it cannot cross delivers first.
    await host.sessions.interrupt(s.id, InterruptQuery(resume=True))
    await host.sessions.wait(s.id)
    assert list(await host.sessions.inbox(s.id)) == []
    assert (await delivered(host, s.id))[-2:] == [compaction.id, note.id]
