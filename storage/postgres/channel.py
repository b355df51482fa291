"""Host-to-host notices over PostgreSQL LISTEN/NOTIFY, on a connection of their own.

The :class:`~storage.interfaces.HostChannel` of a PostgreSQL database, as
:func:`storage.connect.host_channel` hands it out. One shared channel
(:data:`HOST_CHANNEL`); each notice names its sender and its
target host (or none: every other host), and each host keeps only its own and
the broadcasts. NOTIFY is transactional and at most once: a host that is not
listening at that moment never sees the notice, which is why nothing depends
on one arriving (an expired lease is recovered by the scan either way; an
interrupt is answered and resent until it is, :mod:`actors.session.interrupts`).
Payloads are bounded by the server (8000 bytes): :meth:`NotifyChannel.publish`
refuses a larger one instead of letting the server fail it.

The connection is a :class:`~.listen.Listener`'s: kept, and
reconnected when the server ends it (a restart, a failover) or the network
loses it, so a host hears the others again once the server is back; notices
sent meanwhile are lost, as any notice to a host not listening. A publish
waits up to :data:`PUBLISH_WAIT_S` for the connection to be back, then fails
with StorageBrokenError (a 503 at the front door).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Final

import asyncpg
import orjson

from storage.errors import StorageBrokenError, StorageError
from storage.postgres._errors import UNAVAILABLE
from storage.postgres.listen import Listener

__all__ = ["HOST_CHANNEL", "MAX_PAYLOAD", "PUBLISH_WAIT_S", "NotifyChannel"]

log = logging.getLogger(__name__)

HOST_CHANNEL: Final = "sessionrt_hosts"
#: PostgreSQL's limit on a NOTIFY payload, less room for the envelope.
MAX_PAYLOAD: Final = 7900
#: Seconds a publish waits for a lost connection to be back.
PUBLISH_WAIT_S: Final = 5.0

Handler = Callable[[str], None]


class NotifyChannel:
    """``publish(target, origin, body)`` / ``subscribe(host, handler)`` over LISTEN/NOTIFY."""

    def __init__(self, dsn: str, *, on_reconnect: Callable[[], None] | None = None) -> None:
        self._dsn = dsn
        self._on_reconnect = on_reconnect
        self._listener: Listener | None = None
        self._handlers: dict[str, Handler] = {}

    @property
    def listener(self) -> Listener | None:
        """The :class:`~.listen.Listener` (None until open)."""
        return self._listener

    async def open(self) -> None:
        async def connect() -> asyncpg.Connection:
            return await asyncpg.connect(self._dsn)

        listener = Listener(
            connect, HOST_CHANNEL, on_payload=self._on_notify, on_reconnect=self._reconnected
        )
        try:
            await listener.start()
        except (*UNAVAILABLE, asyncpg.PostgresError) as exc:
            await listener.stop()
            # The type only: a message could name the server (never the password,
            # but the URL is the user's to show).
            raise StorageBrokenError(
                f"cannot listen for host notices: {type(exc).__name__}"
            ) from None
        self._listener = listener

    async def close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            await listener.stop()

    async def publish(self, target: str | None, origin: str, body: str) -> None:
        listener = self._listener
        if listener is None:
            raise StorageError("the host notice channel is not open")
        payload = orjson.dumps({"to": target, "from": origin, "body": body}).decode()
        if len(payload.encode()) > MAX_PAYLOAD:
            raise StorageError(f"a host notice of {len(payload)} bytes is over {MAX_PAYLOAD}")
        try:
            async with asyncio.timeout(PUBLISH_WAIT_S):
                await listener.execute("SELECT pg_notify($1, $2)", HOST_CHANNEL, payload)
        except TimeoutError:
            raise StorageBrokenError(
                f"host notice not sent: no connection to the server for {PUBLISH_WAIT_S:g} s"
            ) from None

    def _reconnected(self) -> None:
        # The Listener said it is back; what that costs here is below.
        log.info("host notices sent while the channel was down were lost")
        if self._on_reconnect is not None:
            try:
                self._on_reconnect()
            except Exception:
                log.exception("host notices: the reconnect hook failed")

    def subscribe(self, host_id: str, handler: Handler) -> Callable[[], None]:
        if host_id in self._handlers:
            raise ValueError(f"host {host_id} is already subscribed")
        self._handlers[host_id] = handler

        def unsubscribe() -> None:
            if self._handlers.get(host_id) is handler:
                del self._handlers[host_id]

        return unsubscribe

    def _on_notify(self, payload: str) -> None:
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
