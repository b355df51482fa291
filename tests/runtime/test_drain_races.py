"""A drain's boundary and its promotion are two commands: what runs between them.

The drain reads the inbox at a boundary, decides that input is promotable,
admits instructions, then asks its actor to promote. A request handled in
between (a cancel, a delivery change) may leave nothing promotable, or make
a control item due instead. Found by the delivery state machine
(tests/runtime/test_delivery_stateful.py): the drain took an empty
promotion for "cancelled meanwhile" and ended, with a control item due and
the queued input behind it left pending after the wake that asked for them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from actors.runtime import Runtime
from actors.session.drain import MAX_CONTROL_REFUSALS
from actors.session.inbox import Run, Writer
from protocol import events as ev
from protocol.requests import CreateSessionInput, PromptInput, SyntheticInput
from protocol.shapes import Location
from storage import Command


class ChangedBeforePromotion:
    """The session actor's commands for a drain run by the test, with a request
    handled right before the first promotion, as a concurrent one may be."""

    def __init__(self, rt: Runtime, session_id: str, meanwhile: Run | None) -> None:
        self._rt = rt
        self._session_id = session_id
        self._meanwhile: Run | None = meanwhile

    async def command(self, run: Run, *, keeps_inbox: bool = False) -> Any:
        if (
            self._meanwhile is not None
            and getattr(run, "func", None) is not None
            and (
                run.func.__name__ == "promote"  # type: ignore[attr-defined]
            )
        ):
            meanwhile, self._meanwhile = self._meanwhile, None
            await self._rt.execution.command(self._session_id, meanwhile)
        return await self._rt.execution.command(self._session_id, run, keeps_inbox=keeps_inbox)


async def test_a_control_item_made_due_before_the_promotion_does_not_end_the_drain(
    runtime: Runtime, workdir: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    sid = (
        await runtime.sessions.create(CreateSessionInput(location=Location(directory=str(workdir))))
    ).id
    await runtime.sessions.prompt(sid, PromptInput(text="first"))
    await runtime.execution.wait_idle(sid)
    queued = await runtime.sessions.synthetic(
        sid, SyntheticInput(text="queued", delivery="queue", resume=False)
    )
    move = await runtime.sessions.inbox.move(
        sid, Location(directory=str(elsewhere)), "queue", resume=False
    )

    async def steer_the_move(_: Writer) -> None:
        # PATCH …/inbox/{move} {"delivery": "steer"}, its wake aside.
        changed = ev.InboxDeliveryChanged(session_id=sid, inbox_id=move.id, delivery="steer")
        await runtime.store.append(Command.of(changed))

    # The boundary finds the queued input due (nothing steers, the move waits
    # behind it); before the promotion the move becomes a steer, due first.
    await runtime.services.drain.drain(
        sid, "input", False, ChangedBeforePromotion(runtime, sid, steer_the_move)
    )
    assert list(await runtime.sessions.pending(sid)) == []
    delivered = [
        r.event.inbox_id
        for r in await runtime.store.read(sid, limit=1000)
        if isinstance(r.event, ev.InboxDelivered)
    ]
    assert delivered[-2:] == [move.id, queued.id]
    assert (await runtime.sessions.get(sid)).location.directory == str(elsewhere)


async def test_input_cancelled_before_the_promotion_ends_the_drain(
    runtime: Runtime, workdir: Path
) -> None:
    sid = (
        await runtime.sessions.create(CreateSessionInput(location=Location(directory=str(workdir))))
    ).id
    queued = await runtime.sessions.synthetic(
        sid, SyntheticInput(text="queued", delivery="queue", resume=False)
    )

    async def cancel(_: Writer) -> None:
        cancelled = ev.InboxCancelled(session_id=sid, inbox_id=queued.id)
        await runtime.store.append(Command.of(cancelled))

    await runtime.services.drain.drain(
        sid, "input", False, ChangedBeforePromotion(runtime, sid, cancel)
    )
    types = [r.type.rsplit(".", 1)[0] for r in await runtime.store.read(sid, limit=1000)]
    assert "session.inbox.delivered" not in types
    assert "session.step.started" not in types


async def test_a_control_item_its_actor_keeps_refusing_fails_the_drain_instead_of_looping(
    runtime: Runtime, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refusal means the inbox changed since the boundary's read, so the drain
    reads it again; a drain and an actor that disagree on the rule would do that
    for ever (a merge once made them: the drain delivered a queued control item
    at a steer wake, the actor checked it at the steer scope)."""
    sid = (
        await runtime.sessions.create(CreateSessionInput(location=Location(directory=str(workdir))))
    ).id
    item = await runtime.sessions.compact(sid, delivery="steer")  # resumes: nothing is running
    await runtime.execution.wait_idle(sid)
    assert [i.id for i in await runtime.sessions.pending(sid)] == []  # delivered once, normally
    item = await runtime.sessions.inbox.compact(sid, None, "steer", resume=False)
    asked: list[str] = []

    async def refuse(*args: Any) -> bool:
        asked.append(args[1].id)
        return False

    drain = runtime.services.drain
    monkeypatch.setitem(drain.controls, "compaction", refuse)
    with pytest.raises(RuntimeError, match="refused"):
        await drain.drain(sid, "input", False, ChangedBeforePromotion(runtime, sid, None))
    assert asked == [item.id] * (MAX_CONTROL_REFUSALS + 1)
    assert [i.id for i in await runtime.sessions.pending(sid)] == [item.id]  # kept, not lost
