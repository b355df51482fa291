"""Letting the event loop run without waiting on the clock."""

from __future__ import annotations

import asyncio

#: Far more turns than any chain of tasks and mailboxes in a test takes to settle.
TURNS = 100


async def quiesce(turns: int = TURNS) -> None:
    """Let ``turns`` turns of the loop pass: whatever can happen with no outside event
    (a gate, an answer, a thread) has happened by then, on any machine, however
    loaded. What a test asserts did *not* happen waits on this, never on a sleep."""
    for _ in range(turns):
        await asyncio.sleep(0)
