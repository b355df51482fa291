"""Admission and promotion under concurrency: one fact per intent, whatever the race."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from loop_turns import quiesce
from owner_seams import Arrivals, Parked, Together, first_of, written

from actors.session.inbox import AdmissionGate, Writer, control_head
from actors.sessions import Sessions
from actors.supervisor import Standalone
from protocol import events as ev
from protocol.errors import ConflictError, ServiceUnavailableError, SessionNotFoundError
from protocol.requests import CreateSessionInput, PromptInput
from protocol.shapes import InboxItem, ModelRef
from storage import Boundary, Command, SQLiteStore


async def test_concurrent_exact_retries_admit_once(sessions: Sessions, store: SQLiteStore) -> None:
    s = await sessions.create()
    receipts = await asyncio.gather(
        *(sessions.prompt(s.id, PromptInput(id="msg_hot", text=f"try {i}")) for i in range(100))
    )
    assert len(receipts) == 100
    assert all(r == receipts[0] for r in receipts)
    enqueued = [r for r in await store.read(s.id) if r.type == "session.inbox.enqueued.1"]
    assert len(enqueued) == 1
    assert len(await sessions.pending(s.id)) == 1


async def test_concurrent_promotions_deliver_each_item_once(
    sessions: Sessions, store: SQLiteStore
) -> None:
    s = await sessions.create()
    admitted = [
        await sessions.prompt(
            s.id, PromptInput(text=str(i), delivery="queue" if i % 3 else "steer")
        )
        for i in range(30)
    ]
    counts = await asyncio.gather(
        *(sessions.promote(s.id, "input" if i % 2 else "steer") for i in range(60))
    )
    while await sessions.promote(s.id, "input"):
        pass
    delivered = [
        r.event.inbox_id
        for r in await store.read(s.id, limit=1000)
        if r.type == "session.inbox.delivered.1"
    ]  # type: ignore[union-attr]
    assert sorted(delivered) == sorted(a.id for a in admitted)
    assert sum(counts) <= 30
    assert await sessions.pending(s.id) == []


async def test_admissions_race_with_promotion_without_loss(
    sessions: Sessions, store: SQLiteStore
) -> None:
    s = await sessions.create()

    async def admit(i: int) -> str:
        return (await sessions.prompt(s.id, PromptInput(text=str(i)))).id

    async def promote() -> int:
        total = 0
        for _ in range(20):
            total += await sessions.promote(s.id, "steer")
            await asyncio.sleep(0)
        return total

    results = await asyncio.gather(promote(), *(admit(i) for i in range(50)), promote())
    await sessions.promote(s.id, "steer")
    transcript = (await sessions.messages(s.id, limit=200)).data
    assert sorted(m.id for m in transcript) == sorted(results[1:-1])  # type: ignore[arg-type]
    seqs = [r.seq for r in await store.read(s.id, limit=1000)]
    assert seqs == list(range(1, len(seqs) + 1))


async def test_different_sessions_admit_concurrently(
    sessions: Sessions, store: SQLiteStore
) -> None:
    made = await asyncio.gather(*(sessions.create() for _ in range(20)))
    await asyncio.gather(
        *(sessions.prompt(m.id, PromptInput(text=str(i))) for m in made for i in range(5))
    )
    for m in made:
        assert len(await sessions.pending(m.id)) == 5
        assert await store.last_seq(m.id) == 6


def _count_inbox_reads(store: SQLiteStore) -> Callable[[], int]:
    """How many plain inbox reads ``store.queries`` makes from now on."""
    seen = [0]
    real = store.queries.inbox

    async def counting(session_id: str) -> list[InboxItem]:
        seen[0] += 1
        return await real(session_id)

    store.queries.inbox = counting  # type: ignore[method-assign]
    return lambda: seen[0]


@pytest.fixture
async def owners() -> AsyncIterator[Standalone]:
    standalone = Standalone()
    yield standalone
    await standalone.aclose()


def _own_sessions(owners: Standalone, store: SQLiteStore, tmp_path: Path) -> Sessions:
    return Sessions(store, owners=owners, default_directory=str(tmp_path))


async def _boundary(owners: Standalone, sessions: Sessions, session_id: str) -> Boundary:
    """The boundary read a drain asks its session actor for."""
    read = functools.partial(sessions.inbox.boundary, session_id)
    boundary: Boundary = await owners.command(session_id, read, keeps_inbox=True)
    return boundary


async def _in_order(owners: Standalone, session_id: str, *calls: Awaitable[Any]) -> list[Any]:
    """Queue ``calls`` to the session's actor one after the other, behind a parked
    command, then let them run: one actor handles them all, as it does a drain's
    asks during a busy period (an idle actor between two would be retired)."""
    release = asyncio.Event()

    async def park(_: Writer) -> None:
        await release.wait()

    queued = [asyncio.ensure_future(owners.command(session_id, park))]
    for call in calls:
        await quiesce()
        queued.append(asyncio.ensure_future(call))
    await quiesce()
    release.set()
    return (await asyncio.gather(*queued))[1:]


async def test_promotion_after_the_actors_boundary_read_skips_a_second_read(
    owners: Standalone, store: SQLiteStore, tmp_path: Path
) -> None:
    sessions = _own_sessions(owners, store, tmp_path)
    s = await sessions.create()
    first = await sessions.prompt(s.id, PromptInput(text="one", resume=False))
    reads = _count_inbox_reads(store)
    boundary, promoted = await _in_order(
        owners, s.id, _boundary(owners, sessions, s.id), sessions.promote(s.id, "input")
    )
    assert [i.id for i in boundary.inbox] == [first.id]
    assert promoted == 1
    assert reads() == 0
    assert await sessions.pending(s.id) == []


async def test_a_command_after_the_boundary_read_makes_promotion_read_again(
    owners: Standalone, store: SQLiteStore, tmp_path: Path
) -> None:
    sessions = _own_sessions(owners, store, tmp_path)
    s = await sessions.create()
    await sessions.prompt(s.id, PromptInput(text="a", delivery="queue", resume=False))
    b = await sessions.prompt(s.id, PromptInput(text="b", delivery="queue", resume=False))
    steer = ev.InboxDeliveryChanged(session_id=s.id, inbox_id=b.id, delivery="steer")

    async def change(_: Writer) -> None:
        await store.append(Command.of(steer))

    reads = _count_inbox_reads(store)
    # After the read, a command of the same actor: ``b`` becomes a steer,
    # which the projection cannot tell a stale promotion (``a`` is still pending).
    # The read said ``a`` (the oldest queued); promotion reads again and
    # delivers the steer ``b`` alone.
    _, _, promoted = await _in_order(
        owners,
        s.id,
        _boundary(owners, sessions, s.id),
        owners.command(s.id, change),
        sessions.promote(s.id, "input"),
    )
    assert promoted == 1
    assert reads() == 1
    delivered = [
        r.event.inbox_id  # type: ignore[union-attr]
        for r in await store.read(s.id)
        if r.type == "session.inbox.delivered.1"
    ]
    assert delivered == [b.id]


async def test_an_inbox_change_elsewhere_after_the_boundary_read_falls_back_to_a_read(
    owners: Standalone, store: SQLiteStore, tmp_path: Path
) -> None:
    sessions = _own_sessions(owners, store, tmp_path)
    s = await sessions.create()
    a = await sessions.prompt(s.id, PromptInput(text="a", delivery="queue", resume=False))
    b = await sessions.prompt(s.id, PromptInput(text="b", delivery="queue", resume=False))
    cancelled = ev.InboxCancelled(session_id=s.id, inbox_id=a.id)

    async def elsewhere(_: Writer) -> None:
        # Another host's cancellation: straight to the log, and the actor's
        # knowledge of its inbox kept, as this host never hears of it.
        await store.append(Command.of(cancelled))

    reads = _count_inbox_reads(store)
    _, _, promoted = await _in_order(
        owners,
        s.id,
        _boundary(owners, sessions, s.id),
        owners.command(s.id, elsewhere, keeps_inbox=True),
        sessions.promote(s.id, "input"),
    )
    assert promoted == 1
    assert reads() == 1  # the delivery of ``a`` was refused: read afresh
    delivered = [
        r.event.inbox_id  # type: ignore[union-attr]
        for r in await store.read(s.id)
        if r.type == "session.inbox.delivered.1"
    ]
    assert delivered == [b.id]
    assert await sessions.pending(s.id) == []


async def test_concurrent_commands_to_one_session_run_one_at_a_time_in_order(
    owners: Standalone,
) -> None:
    """No lock: the session's actor runs its commands one by one, in arrival
    order, while another session's commands run beside them; then it retires."""
    inside: dict[str, int] = {"ses_a": 0, "ses_b": 0}
    most = dict(inside)
    order: list[int] = []
    gate = asyncio.Event()

    def command(session_id: str, n: int) -> Callable[[Writer], Awaitable[int]]:
        async def run(writer: Writer) -> int:
            inside[session_id] += 1
            most[session_id] = max(most[session_id], inside[session_id])
            if session_id == "ses_a":
                order.append(n)
                await gate.wait()  # every other command queues behind this one
            await asyncio.sleep(0)
            inside[session_id] -= 1
            return n

        return run

    first = asyncio.ensure_future(owners.command("ses_a", command("ses_a", 0)))
    rest = [
        asyncio.ensure_future(owners.command("ses_a", command("ses_a", n))) for n in range(1, 20)
    ]
    # Another session is not held up by the first one's command.
    assert await owners.command("ses_b", command("ses_b", 0)) == 0
    assert order == [0]
    gate.set()
    assert await asyncio.gather(first, *rest) == list(range(20))
    assert order == list(range(20))
    assert most == {"ses_a": 1, "ses_b": 1}
    await quiesce()
    assert owners.session_actors() == []  # retired once idle


async def test_a_failing_command_answers_its_caller_and_the_actor_goes_on(
    owners: Standalone,
) -> None:
    async def fail(_: Writer) -> None:
        raise ConflictError("no", resource="inbox")

    async def fine(_: Writer) -> str:
        return "ok"

    with pytest.raises(ConflictError):
        await owners.command("ses_a", fail)
    assert await owners.command("ses_a", fine) == "ok"


def test_a_closing_gate_waits_for_admissions_under_way_then_refuses() -> None:
    gate = AdmissionGate()

    async def admission(release: asyncio.Event, fail: bool = False) -> None:
        with gate.admitting():
            await release.wait()
            if fail:
                raise ValueError("refused")

    async def scenario() -> None:
        ok, bad = asyncio.Event(), asyncio.Event()
        first = asyncio.ensure_future(admission(ok))
        second = asyncio.ensure_future(admission(bad, fail=True))
        await asyncio.sleep(0)
        closing = asyncio.ensure_future(gate.close())
        await quiesce()
        assert not closing.done()  # two under way
        bad.set()
        with pytest.raises(ValueError, match="refused"):
            await second
        await quiesce()
        assert not closing.done()  # a failed one counts out too, one is left
        ok.set()
        await first
        await asyncio.wait_for(closing, 1)
        with pytest.raises(ServiceUnavailableError), gate.admitting():
            pass

    asyncio.run(scenario())


async def test_a_control_item_a_change_of_delivery_put_behind_a_steer_waits_for_it(
    owners: Standalone, store: SQLiteStore, tmp_path: Path
) -> None:
    sessions = _own_sessions(owners, store, tmp_path)
    s = await sessions.create()
    older = await sessions.prompt(s.id, PromptInput(text="older", delivery="queue", resume=False))
    control = await sessions.compact(s.id, delivery="steer")
    # At a step boundary the steered control item is due: queued input ahead
    # of it does not hold it back. The drain asks its actor to deliver it.
    boundary = await _boundary(owners, sessions, s.id)
    assert control_head(boundary.inbox, "steer") == control
    started = ev.CompactionStarted(session_id=s.id, reason="manual", recent="", input_id=control.id)
    deliver = functools.partial(sessions.inbox.control, s.id, control, (started,), scope="steer")
    steer = ev.InboxDeliveryChanged(session_id=s.id, inbox_id=older.id, delivery="steer")

    async def change(_: Writer) -> None:
        await store.append(Command.of(steer))

    # Handled by the actor before the delivery: ``older`` is a steer ahead of it now.
    _, delivered = await _in_order(
        owners, s.id, owners.command(s.id, change), owners.command(s.id, deliver)
    )
    assert delivered is False
    assert [i.id for i in await sessions.pending(s.id)] == [older.id, control.id]
    # The next boundary promotes the steer; then the control item is due again.
    assert await sessions.promote(s.id, "steer") == 1
    assert await owners.command(s.id, deliver) is True
    order = [
        r.event.inbox_id  # type: ignore[union-attr]
        for r in await store.read(s.id)
        if r.type == "session.inbox.delivered.1"
    ]
    assert order == [older.id, control.id]


async def test_concurrent_switches_chain_their_previous_values(
    owners: Standalone, store: SQLiteStore, tmp_path: Path
) -> None:
    together = Together(owners)
    sessions = Sessions(store, owners=together, default_directory=str(tmp_path))
    s = await sessions.create(CreateSessionInput(agent="build"))
    m1, m2 = ModelRef(id="m1", provider_id="scripted"), ModelRef(id="m2", provider_id="scripted")
    # Each switch's command arrives only once both have: whatever either read
    # before its command, it read before the other switched.
    together.hold(2)
    await asyncio.gather(sessions.switch_model(s.id, m1), sessions.switch_model(s.id, m2))
    together.hold(2)
    await asyncio.gather(sessions.switch_agent(s.id, "plan"), sessions.switch_agent(s.id, "ask"))
    recorded = [r.event for r in await store.read(s.id)]
    models = [e for e in recorded if isinstance(e, ev.ModelSelected)]
    agents = [e for e in recorded if isinstance(e, ev.AgentSelected)]
    assert [e.previous for e in models] == [None, models[0].model]
    assert [e.previous for e in agents] == ["build", agents[0].agent]
    now = await sessions.get(s.id)
    assert (now.model, now.agent) == (models[1].model, agents[1].agent)


async def test_a_childs_deletion_waits_for_the_command_its_actor_runs(
    owners: Standalone, store: SQLiteStore, tmp_path: Path
) -> None:
    arrivals = Arrivals(owners)
    sessions = Sessions(store, owners=arrivals, default_directory=str(tmp_path))
    root = await sessions.create()
    child = await sessions.create(CreateSessionInput(parent_id=root.id))
    renamed = ev.SessionRenamed(session_id=child.id, title="written by its own command")
    # A command of the child's actor under way (an admission, say), its write last.
    parked = Parked(owners, child.id, lambda: store.append(Command.of(renamed)))
    await parked.running.wait()
    deleted = written(store, child.id, "session.deleted")
    asked = arrivals.expect(child.id)
    removing = asyncio.ensure_future(sessions.remove(root.id))
    # The deletion either asks the child's actor or writes past it.
    await first_of(asked, deleted)
    assert not deleted.is_set()
    # A prompt to the child now comes after its deletion: refused, nothing admitted.
    late = asyncio.ensure_future(sessions.prompt(child.id, PromptInput(text="too late")))
    await parked.release()
    await removing
    with pytest.raises(SessionNotFoundError):
        await late
    types = [r.type for r in await store.read(child.id)]
    assert types[-2:] == ["session.renamed.1", "session.deleted.2"]
    for gone in (root.id, child.id):
        with pytest.raises(SessionNotFoundError):
            await sessions.get(gone)
