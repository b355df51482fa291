"""The follow dispatcher: one subscription, and each follow rung only by its own session."""

from __future__ import annotations

import asyncio
from pathlib import Path

from protocol import Location
from protocol import events as ev
from storage import Command, FollowDispatcher, SQLiteStore


def created(session_id: str) -> ev.SessionCreated:
    return ev.SessionCreated(session_id=session_id, title="t", location=Location(directory="/"))


async def test_a_commit_rings_only_the_follows_of_its_session(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "db.sqlite", synchronous="NORMAL") as store:
        for sid in ("ses_a", "ses_b"):
            await store.append(Command.of(created(sid)))
        follows = FollowDispatcher(store)
        before = len(store._subscribers)
        async with (
            follows.follow("ses_a", follow=True) as a1,
            follows.follow("ses_a", follow=True) as a2,
            follows.follow("ses_b", follow=True) as b,
        ):
            assert len(store._subscribers) == before + 1  # one subscription for all three
            assert follows.open_follows == 3
            assert (a1.watermark, b.watermark) == (1, 1)
            for f in (a1, a2, b):
                _ = [page async for page in f.replay()]
            await store.append(Command.of(ev.SessionRenamed(session_id="ses_a", title="x")))
            assert a1._bell.is_set()
            assert a2._bell.is_set()
            assert not b._bell.is_set()
            pages = a1.changes(idle_s=5)
            page = await anext(pages)
            assert [r.seq for r in page] == [2]
            await pages.aclose()
        # The last follow gone: no index entry and no subscription left behind.
        assert follows.open_follows == 0
        assert len(store._subscribers) == before


async def test_a_follow_opened_before_a_commit_never_misses_it(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "db.sqlite", synchronous="NORMAL") as store:
        await store.append(Command.of(created("ses_a")))
        follows = FollowDispatcher(store)
        async with follows.follow("ses_a", follow=True) as log:
            replayed = [r.seq for page in [p async for p in log.replay()] for r in page]
            assert replayed == [1]
            commit = asyncio.ensure_future(
                store.append(Command.of(ev.SessionRenamed(session_id="ses_a", title="y")))
            )
            seen: list[int] = []
            async for page in log.changes(idle_s=5):
                seen += [r.seq for r in page]
                if seen:
                    log.close()
            await commit
            assert seen == [2]
