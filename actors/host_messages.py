"""Host-to-host messages: how a host that admits work reaches the host that runs it.

Any host admits input for any session, but only the lease holder executes it
(:mod:`storage.lease`). A wake, an interrupt or a resume admitted elsewhere is
published to the owner's host id; a host shutting down broadcasts the
sessions it released, so the others take them without waiting for expiry.

Delivery is at most once and carries no reply: a message to a host that is
gone (or whose connection to the server is being re-made) is lost, and the
periodic recovery scan picks its sessions up once its leases expire; a wake
is advisory, so a lost one leaves its input admitted, run at the next wake.
An interrupt is the one message that must arrive: :mod:`actors.session.interrupts`
has it answered and resends it until it is.
:class:`LocalHostBus` connects hosts of one process (SQLite, and tests);
:class:`NotifyHostBus` connects processes that share a database server,
through the :class:`~storage.HostChannel` :func:`storage.host_channel` hands
out (on PostgreSQL, LISTEN/NOTIFY on a connection it re-makes when lost).
A subscriber's handler runs on the event loop and must not block.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final, Literal, Protocol

import attrs
import orjson

from storage import HostChannel, host_channel

__all__ = ["HostBus", "HostMessage", "LocalHostBus", "NotifyHostBus"]

log = logging.getLogger(__name__)

MessageKind = Literal["wake", "interrupt", "answer", "resume", "released"]


@attrs.frozen(kw_only=True)
class HostMessage:
    kind: MessageKind
    #: The sending host.
    origin: str
    session_ids: tuple[str, ...]
    #: The wake's scope (``wake`` only).
    scope: Literal["input", "steer"] = "input"
    #: An ``interrupt``'s request id, which its ``answer`` repeats
    #: (:mod:`actors.session.interrupts`); empty: no answer wanted.
    request: str = ""
    #: The ``answer``: True when the owner's interrupt stopped an execution.
    answer: bool = False

    def encode(self) -> str:
        return orjson.dumps(
            {
                "kind": self.kind,
                "origin": self.origin,
                "sessions": self.session_ids,
                "scope": self.scope,
                "request": self.request,
                "answer": self.answer,
            }
        ).decode()

    @classmethod
    def decode(cls, text: str) -> HostMessage:
        raw = orjson.loads(text)
        if not isinstance(raw.get("request", ""), str):
            raise TypeError("a host message's request id is not a string")
        return cls(
            kind=raw["kind"],
            origin=raw["origin"],
            session_ids=tuple(raw["sessions"]),
            scope=raw["scope"],
            request=raw.get("request", ""),
            answer=raw.get("answer", False) is True,
        )


Handler = Callable[[HostMessage], None]


class HostBus(Protocol):
    async def publish(self, host_id: str | None, message: HostMessage) -> None:
        """Send ``message`` to ``host_id``; to every other host when None."""
        ...

    async def subscribe(self, host_id: str, handler: Handler) -> Callable[[], None]:
        """Deliver the messages for ``host_id`` (and broadcasts) to ``handler``."""
        ...


class LocalHostBus:
    """Hosts of one process: delivery is a direct call of the target's handler."""

    def __init__(self) -> None:
        self._hosts: dict[str, Handler] = {}

    async def publish(self, host_id: str | None, message: HostMessage) -> None:
        if host_id is None:
            targets = [h for hid, h in self._hosts.items() if hid != message.origin]
        else:
            handler = self._hosts.get(host_id)
            targets = [] if handler is None else [handler]
        for handler in targets:
            try:
                handler(message)
            except Exception:
                log.exception("host message handler failed")

    async def subscribe(self, host_id: str, handler: Handler) -> Callable[[], None]:
        if host_id in self._hosts:
            raise ValueError(f"host {host_id} is already subscribed")
        self._hosts[host_id] = handler

        def unsubscribe() -> None:
            if self._hosts.get(host_id) is handler:
                del self._hosts[host_id]

        return unsubscribe


#: Session ids per notice: a shutdown's list is split to keep each under the
#: server's payload limit (ids are about 30 bytes).
_IDS_PER_NOTICE: Final = 100


class NotifyHostBus:
    """Hosts in several processes, over their database server's host channel.

    Owns its channel (and the channel's connection): ``open`` before use,
    ``close`` after the last publish.
    """

    def __init__(self, database: str, *, on_reconnect: Callable[[], None] | None = None) -> None:
        #: ``on_reconnect``: called once the channel listens again after losing
        #: its connection (what was sent meanwhile is lost).
        self._channel = host_channel(database, on_reconnect=on_reconnect)

    @property
    def channel(self) -> HostChannel:
        return self._channel

    async def open(self) -> None:
        await self._channel.open()

    async def close(self) -> None:
        await self._channel.close()

    async def publish(self, host_id: str | None, message: HostMessage) -> None:
        ids = message.session_ids
        for start in range(0, max(len(ids), 1), _IDS_PER_NOTICE):
            part = attrs.evolve(message, session_ids=ids[start : start + _IDS_PER_NOTICE])
            await self._channel.publish(host_id, message.origin, part.encode())

    async def subscribe(self, host_id: str, handler: Handler) -> Callable[[], None]:
        def deliver(body: str) -> None:
            try:
                message = HostMessage.decode(body)
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                log.warning("ignored a malformed host message")
                return
            handler(message)

        return self._channel.subscribe(host_id, deliver)
