"""Admission and promotion under concurrency: one fact per intent, whatever the race."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from loop_turns import quiesce

from actors._keyed_lock import KeyedLock
from actors.inbox import AdmissionGate, Seen
from actors.sessions import Sessions
from protocol import events as ev
from protocol.errors import ServiceUnavailableError
from protocol.requests import PromptInput
from protocol.shapes import InboxItem
from storage import Command, SQLiteStore


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


async def test_promotion_from_a_boundary_read_skips_a_second_read(
    sessions: Sessions, store: SQLiteStore
) -> None:
    s = await sessions.create()
    first = await sessions.prompt(s.id, PromptInput(text="one", resume=False))
    generation = sessions.inbox.generation(s.id)
    boundary = await store.queries.boundary(s.id)
    assert [i.id for i in boundary.inbox] == [first.id]
    reads = _count_inbox_reads(store)
    assert await sessions.promote(s.id, "input", Seen(generation, boundary.inbox)) == 1
    assert reads() == 0
    assert await sessions.pending(s.id) == []


async def test_an_inbox_change_here_after_the_boundary_read_is_seen_by_promotion(
    sessions: Sessions, store: SQLiteStore
) -> None:
    s = await sessions.create()
    await sessions.prompt(s.id, PromptInput(text="a", delivery="queue", resume=False))
    b = await sessions.prompt(s.id, PromptInput(text="b", delivery="queue", resume=False))
    generation = sessions.inbox.generation(s.id)
    boundary = await store.queries.boundary(s.id)
    # After the read, under the inbox lock: ``b`` becomes a steer, which the
    # projection cannot tell a stale promotion (``a`` is still pending).
    await sessions.change_delivery(s.id, b.id, "steer")
    reads = _count_inbox_reads(store)
    # The read said ``a`` (the oldest queued); promotion reads again and
    # delivers the steer ``b`` alone.
    assert await sessions.promote(s.id, "input", Seen(generation, boundary.inbox)) == 1
    assert reads() == 1
    delivered = [
        r.event.inbox_id  # type: ignore[union-attr]
        for r in await store.read(s.id)
        if r.type == "session.inbox.delivered.1"
    ]
    assert delivered == [b.id]


async def test_an_inbox_change_elsewhere_after_the_boundary_read_falls_back_to_a_read(
    sessions: Sessions, store: SQLiteStore
) -> None:
    s = await sessions.create()
    a = await sessions.prompt(s.id, PromptInput(text="a", delivery="queue", resume=False))
    b = await sessions.prompt(s.id, PromptInput(text="b", delivery="queue", resume=False))
    generation = sessions.inbox.generation(s.id)
    boundary = await store.queries.boundary(s.id)
    # Another host's cancellation: straight to the log, not through this inbox's lock.
    await store.append(Command.of(ev.InboxCancelled(session_id=s.id, inbox_id=a.id)))
    assert sessions.inbox.generation(s.id) == generation
    assert await sessions.promote(s.id, "input", Seen(generation, boundary.inbox)) == 1
    delivered = [
        r.event.inbox_id  # type: ignore[union-attr]
        for r in await store.read(s.id)
        if r.type == "session.inbox.delivered.1"
    ]
    assert delivered == [b.id]
    assert await sessions.pending(s.id) == []


def _count_inbox_reads(store: SQLiteStore) -> Callable[[], int]:
    """How many plain inbox reads ``store.queries`` makes from now on."""
    seen = [0]
    real = store.queries.inbox

    async def counting(session_id: str) -> list[InboxItem]:
        seen[0] += 1
        return await real(session_id)

    store.queries.inbox = counting  # type: ignore[method-assign]
    return lambda: seen[0]


def test_a_lock_generation_grows_on_release_and_survives_forgetting() -> None:
    locks = KeyedLock(max_generations=2)

    async def hold(key: str) -> None:
        async with locks.hold(key):
            pass

    async def scenario() -> None:
        start = locks.generation("a")
        await hold("b")
        assert locks.generation("a") == start  # another key's release
        await hold("a")
        after_a = locks.generation("a")
        assert after_a > start
        await hold("c")
        await hold("d")  # "a" is forgotten (two remembered)
        assert locks.generation("a") >= after_a  # never smaller once forgotten

    asyncio.run(scenario())


def test_a_key_is_held_by_one_at_a_time_and_forgotten_when_nobody_wants_it() -> None:
    locks = KeyedLock()
    inside: list[str] = []
    log: list[str] = []

    async def holder(name: str, gate: asyncio.Event | None = None) -> None:
        async with locks.hold("k"):
            inside.append(name)
            assert len(inside) == 1
            log.append(name)
            if gate is not None:
                await gate.wait()
            inside.remove(name)

    async def failing() -> None:
        async with locks.hold("k"):
            raise ValueError("in the block")

    async def scenario() -> None:
        gate = asyncio.Event()
        first = asyncio.ensure_future(holder("first", gate))
        await asyncio.sleep(0)
        second = asyncio.ensure_future(holder("second"))
        cancelled = asyncio.ensure_future(holder("cancelled"))
        await asyncio.sleep(0)
        cancelled.cancel()  # while waiting for the key
        await asyncio.sleep(0)
        gate.set()
        await asyncio.gather(first, second)
        assert cancelled.cancelled()
        assert log == ["first", "second"]
        before = locks.generation("k")
        with pytest.raises(ValueError, match="in the block"):
            await failing()
        assert locks.generation("k") > before  # released all the same
        assert len(locks) == 0  # no holder, no waiter: nothing kept
        await holder("again")  # and usable
        assert log[-1] == "again"

    asyncio.run(scenario())


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
