"""SIGKILL a real ``sessionrt serve`` while a manual compaction summarizes.

The compaction's control item was consumed at its delivery, so failing the
cut-off compaction would lose the request: the user would have to ask again.
The restarted server's recovery fails the cut-off run (``compaction.interrupted``)
and delivers it again once, under a derived id; that second run completes.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
from serve_proc import serving

from protocol.client import Client
from protocol.requests import CreateSessionInput, PromptInput
from protocol.shapes import CompactionMessage, Location, SessionMessage

#: Real servers started and killed: first, so they do not end the run alone.
pytestmark = pytest.mark.slow

T = TypeVar("T")
GUARD = 30.0
DEVNULL = asyncio.subprocess.DEVNULL
#: Eight characters a chunk, 300 ms before each: some seconds of summarizing.
SLOW_SUMMARY = (
    "#summary-delay 300\n"
    "#summary A slow checkpoint, written in many small pieces, one after another.\n"
    "#text first answer"
)


async def _polled(read: Callable[[], Awaitable[T]], done: Callable[[T], bool]) -> T:
    """``read()`` again until ``done`` says so (under a guard, never the assertion)."""
    async with asyncio.timeout(GUARD):
        for _ in itertools.count():
            value = await read()
            if done(value):
                return value
            await asyncio.sleep(0.02)
    raise AssertionError("unreachable")


def _compactions(messages: tuple[SessionMessage, ...]) -> list[CompactionMessage]:
    return [m for m in messages if isinstance(m, CompactionMessage)]


async def test_a_manual_compaction_cut_off_by_sigkill_is_delivered_again(
    tmp_path: Path,
) -> None:
    data, project = tmp_path / "data", tmp_path / "project"
    project.mkdir()
    data.mkdir(mode=0o700)
    async with serving(data, stderr=DEVNULL) as served, Client(served.url) as client:
        session = await client.sessions.create(
            CreateSessionInput(location=Location(directory=str(project)))
        )
        await client.sessions.prompt(session.id, PromptInput(text=SLOW_SUMMARY))
        await client.sessions.wait(session.id)
        await client.sessions.prompt(session.id, PromptInput(text="second question"))
        await client.sessions.wait(session.id)
        item = await client.sessions.compact(session.id)

        async def compactions() -> list[CompactionMessage]:
            return _compactions((await client.sessions.messages(session.id)).data)

        [running] = await _polled(compactions, bool)
        assert (running.id, running.status) == (item.id, "running")
        served.proc.send_signal(signal.SIGKILL)
        await served.proc.wait()

    async with serving(data, stderr=DEVNULL) as served, Client(served.url) as client:

        async def settled() -> list[CompactionMessage]:
            return _compactions((await client.sessions.messages(session.id)).data)

        found = await _polled(
            settled, lambda cs: len(cs) == 2 and all(c.status != "running" for c in cs)
        )
        by_id = {c.id: c for c in found}
        cut = by_id[item.id]
        assert cut.status == "failed"
        assert (cut.error or {}).get("type") == "compaction.interrupted"
        [again] = [c for c in found if c.id != item.id]
        assert (again.reason, again.status) == ("manual", "completed")
        assert again.text is not None
        assert "slow checkpoint" in again.text
        # The resumed drain goes on (the restart notice); then nothing is left.
        await client.sessions.wait(session.id)
        context = await client.sessions.context(session.id)
        assert context[0].id == again.id
        assert await client.sessions.inbox(session.id) == ()
        served.proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(served.proc.wait(), GUARD) == 0
