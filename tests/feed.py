"""A recorder of the instance feed that lets a test wait for an event."""

from __future__ import annotations

import asyncio
from typing import Any

from protocol.events import EventEnvelope


class Feed:
    """Records the instance feed and lets a test wait for a given event."""

    def __init__(self) -> None:
        self.events: list[EventEnvelope] = []
        self._waiters: list[tuple[Any, asyncio.Future[EventEnvelope]]] = []

    def __call__(self, message: EventEnvelope) -> None:
        self.events.append(message)
        for entry in list(self._waiters):
            predicate, future = entry
            if not future.done() and predicate(message):
                future.set_result(message)
                self._waiters.remove(entry)

    async def wait(
        self, type_: str, within: float = 10, *, after: int = 0, **data: Any
    ) -> EventEnvelope:
        """The first matching event; ``after``: among those from ``events[after]`` on."""

        def match(m: EventEnvelope) -> bool:
            return m["type"] == type_ and all(m["data"].get(k) == v for k, v in data.items())

        for message in self.events[after:]:
            if match(message):
                return message
        future: asyncio.Future[EventEnvelope] = asyncio.get_running_loop().create_future()
        self._waiters.append((match, future))
        return await asyncio.wait_for(future, within)

    def types(self, session_id: str, durable_only: bool = True) -> list[str]:
        return [
            m["type"]
            for m in self.events
            if m["data"].get("sessionID") == session_id and (m.get("durable") or not durable_only)
        ]
