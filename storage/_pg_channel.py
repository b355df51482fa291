"""Host-to-host notices over PostgreSQL LISTEN/NOTIFY, on a connection of their own.

One shared channel (:data:`CHANNEL`); each notice names its sender and its
target host (or none: every other host), and each host keeps only its own and
the broadcasts. NOTIFY is transactional and at most once: a host that is not
listening at that moment never sees the notice, which is why nothing depends
on one arriving (an expired lease is recovered by the scan either way).
Payloads are bounded by the server (8000 bytes): :meth:`NotifyChannel.publish`
refuses a larger one instead of letting the server fail it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any, Final

import orjson

from storage.errors import StorageBrokenError, StorageError

__all__ = ["CHANNEL", "MAX_PAYLOAD", "NotifyChannel"]

log = logging.getLogger(__name__)

CHANNEL: Final = "sessionrt_hosts"
#: PostgreSQL's limit on a NOTIFY payload, less room for the envelope.
MAX_PAYLOAD: Final = 7900

Handler = Callable[[str], None]


class NotifyChannel:
    """``publish(target, origin, body)`` / ``subscribe(host, handler)`` over LISTEN/NOTIFY."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._conn: Any = None
        self._handlers: dict[str, Handler] = {}

    async def open(self) -> None:
        import asyncpg

        try:
            self._conn = await asyncpg.connect(self._dsn)
            await self._conn.add_listener(CHANNEL, self._on_notify)
        except (OSError, asyncpg.PostgresError) as exc:
            raise StorageBrokenError(f"cannot listen for host notices: {exc}") from exc

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    async def publish(self, target: str | None, origin: str, body: str) -> None:
        if self._conn is None:
            raise StorageError("the host notice channel is not open")
        payload = orjson.dumps({"to": target, "from": origin, "body": body}).decode()
        if len(payload.encode()) > MAX_PAYLOAD:
            raise StorageError(f"a host notice of {len(payload)} bytes is over {MAX_PAYLOAD}")
        await self._conn.execute("SELECT pg_notify($1, $2)", CHANNEL, payload)

    def subscribe(self, host_id: str, handler: Handler) -> Callable[[], None]:
        if host_id in self._handlers:
            raise ValueError(f"host {host_id} is already subscribed")
        self._handlers[host_id] = handler

        def unsubscribe() -> None:
            if self._handlers.get(host_id) is handler:
                del self._handlers[host_id]

        return unsubscribe

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        try:
            raw = orjson.loads(payload)
            target, origin, body = raw["to"], raw["from"], raw["body"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            log.warning("ignored a malformed host notice")
            return
        for host_id, handler in list(self._handlers.items()):
            if target == host_id or (target is None and origin != host_id):
                try:
                    handler(body)
                except Exception:
                    log.exception("host notice handler failed")
