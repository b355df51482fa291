"""Admission and promotion under concurrency: one fact per intent, whatever the race."""

from __future__ import annotations

import asyncio

from actors.sessions import Sessions
from protocol.requests import PromptInput
from storage import SQLiteStore


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
