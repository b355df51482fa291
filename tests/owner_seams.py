"""Owners seams for tests: a session's commands passed on to its real actor,
with the moment each arrives made visible, or several held to arrive together."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from actors.session.inbox import Owners, Run, Writer
from storage import RecordedEvent, Store


class Arrivals:
    """Passes every command on to ``inner``; :meth:`expect` says when one comes for a session."""

    def __init__(self, inner: Owners) -> None:
        self._inner = inner
        self._expected: dict[str, asyncio.Event] = {}

    def expect(self, session_id: str) -> asyncio.Event:
        """Set by the next command for ``session_id`` that arrives from now on."""
        event = self._expected[session_id] = asyncio.Event()
        return event

    async def command(self, session_id: str, run: Run, *, keeps_inbox: bool = False) -> Any:
        expected = self._expected.pop(session_id, None)
        if expected is not None:
            expected.set()
        return await self._inner.command(session_id, run, keeps_inbox=keeps_inbox)


class Together:
    """Passes commands on to ``inner``; after :meth:`hold` ``n``, the next ``n`` wait
    until all of them have arrived (so whatever each read before it, it read
    before any of them ran)."""

    def __init__(self, inner: Owners) -> None:
        self._inner = inner
        self._left = 0
        self._all = asyncio.Event()

    def hold(self, n: int) -> None:
        self._left, self._all = n, asyncio.Event()

    async def command(self, session_id: str, run: Run, *, keeps_inbox: bool = False) -> Any:
        if self._left:
            self._left -= 1
            everyone = self._all
            if self._left:
                await everyone.wait()
            else:
                everyone.set()
        return await self._inner.command(session_id, run, keeps_inbox=keeps_inbox)


class Parked:
    """A command of a session's actor that waits for :meth:`release`, then writes
    ``then`` (the session's own write, from inside its actor)."""

    def __init__(self, owners: Owners, session_id: str, then: Callable[[], Awaitable[Any]]) -> None:
        self.running = asyncio.Event()
        self._release = asyncio.Event()
        self._then = then
        self.done = asyncio.ensure_future(owners.command(session_id, self._run))

    async def _run(self, _: Writer) -> None:
        self.running.set()
        await self._release.wait()
        await self._then()

    async def release(self) -> None:
        self._release.set()
        await self.done


def written(store: Store, session_id: str, type_prefix: str) -> asyncio.Event:
    """Set once an event of ``session_id`` whose type starts with ``type_prefix`` commits."""
    seen = asyncio.Event()

    def watch(records: Sequence[RecordedEvent]) -> None:
        if any(r.aggregate_id == session_id and r.type.startswith(type_prefix) for r in records):
            seen.set()

    store.subscribe(watch)
    return seen


async def first_of(*events: asyncio.Event) -> None:
    """Return once any of ``events`` is set."""
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
