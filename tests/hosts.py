"""Several runtimes (hosts) of one process on one store and one in-process host bus."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

from feed import Feed

from actors.event_bus import EventBus
from actors.host_messages import HostMessage, LocalHostBus
from actors.runtime import Runtime, RuntimeConfig
from storage import SQLiteStore


class RecordingBus(LocalHostBus):
    """The in-process bus, keeping what was sent (to whom, what)."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str | None, HostMessage]] = []

    async def publish(self, host_id: str | None, message: HostMessage) -> None:
        self.sent.append((host_id, message))
        await super().publish(host_id, message)

    def kinds(self, kind: str) -> list[HostMessage]:
        return [m for _, m in self.sent if m.kind == kind]


class Hosts:
    """Runtimes sharing ``store`` and ``bus``, each with its own execution, leases,
    renewal and scan, as servers on one PostgreSQL database would; ``feed`` hears
    every commit. Each runtime waits on the store's clock (a test's ManualClock
    moves the leases' expiry and every host's waits together)."""

    def __init__(self, tmp_path: Path, store: SQLiteStore, bus: RecordingBus) -> None:
        self.tmp_path = tmp_path
        self.store = store
        self.bus = bus
        self.stack = AsyncExitStack()
        self.feed = Feed()
        self.events = EventBus(store)
        self.events.subscribe(self.feed)

    async def start(self, host_id: str, *, ttl_ms: int = 60_000) -> Runtime:
        config = RuntimeConfig(
            data_dir=self.tmp_path / "data",
            default_directory=str(self.tmp_path),
            host_id=host_id,
            lease_ttl_ms=ttl_ms,
            clock=self.store.clock,
        )
        return await self.stack.enter_async_context(
            Runtime(config, store=self.store, host_bus=self.bus)
        )

    async def writers(self, session_id: str) -> list[tuple[int, str, int]]:
        """(position, host, epoch) of every fenced event of the session, in log order."""
        rows = await self.store.fetch(
            "SELECT position, host_id, epoch FROM event_fence WHERE session_id = ?"
            " ORDER BY position",
            (session_id,),
        )
        return [(int(r[0]), str(r[1]), int(r[2])) for r in rows]

    async def types(self, session_id: str) -> list[str]:
        return [r.type for r in await self.store.read(session_id, limit=1000)]
