"""Session events: the facts the log records.

Each event is a frozen attrs class with a wire ``TYPE`` (no version, e.g.
``session.inbox.enqueued``) and a ``VERSION``; the log stores the versioned
name (``session.inbox.enqueued.1``). Every session event's aggregate is its
``session_id``. :data:`REGISTRY` is the explicit list of what this build can
decode; a stored type missing from it is skipped on read (see
:func:`decode_event`), never a crash.

Names and fields follow ``reference/opencode-v2.md`` §2.2.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import attrs
import orjson

from protocol import codec
from protocol.shapes import Delivery, InboxItemType, Location, ModelRef

__all__ = [
    "REGISTRY",
    "AgentSelected",
    "EnqueuedItem",
    "Event",
    "InboxCancelled",
    "InboxDelivered",
    "InboxDeliveryChanged",
    "InboxEnqueued",
    "MetadataUpdated",
    "ModelSelected",
    "SessionCreated",
    "SessionDeleted",
    "SessionRenamed",
    "SyntheticRecorded",
    "decode_event",
    "encode_data",
    "envelope",
    "stored_type",
]


@attrs.frozen(kw_only=True)
class Event:
    """Base of every session event; ``session_id`` is the aggregate."""

    TYPE: ClassVar[str]
    VERSION: ClassVar[int] = 1
    #: Live-only events are published but never stored.
    DURABLE: ClassVar[bool] = True

    session_id: str


@attrs.frozen(kw_only=True)
class SessionCreated(Event):
    TYPE = "session.created"
    parent_id: str | None = None
    title: str
    agent: str | None = None
    model: ModelRef | None = None
    location: Location
    metadata: Mapping[str, Any] | None = None


@attrs.frozen(kw_only=True)
class SessionRenamed(Event):
    TYPE = "session.renamed"
    title: str


@attrs.frozen(kw_only=True)
class MetadataUpdated(Event):
    TYPE = "session.metadata.updated"
    metadata: Mapping[str, Any]


@attrs.frozen(kw_only=True)
class AgentSelected(Event):
    TYPE = "session.agent.selected"
    agent: str
    previous: str | None = None


@attrs.frozen(kw_only=True)
class ModelSelected(Event):
    TYPE = "session.model.selected"
    model: ModelRef
    previous: ModelRef | None = None


@attrs.frozen(kw_only=True)
class SessionDeleted(Event):
    TYPE = "session.deleted"
    VERSION = 2


@attrs.frozen(kw_only=True)
class EnqueuedItem:
    type: InboxItemType
    payload: Mapping[str, Any]
    delivery: Delivery


@attrs.frozen(kw_only=True)
class InboxEnqueued(Event):
    TYPE = "session.inbox.enqueued"
    inbox_id: str
    item: EnqueuedItem


@attrs.frozen(kw_only=True)
class InboxDelivered(Event):
    TYPE = "session.inbox.delivered"
    inbox_id: str


@attrs.frozen(kw_only=True)
class InboxCancelled(Event):
    TYPE = "session.inbox.cancelled"
    inbox_id: str


@attrs.frozen(kw_only=True)
class InboxDeliveryChanged(Event):
    TYPE = "session.inbox.delivery.changed"
    inbox_id: str
    delivery: Delivery


@attrs.frozen(kw_only=True)
class SyntheticRecorded(Event):
    """A synthetic transcript message recorded directly, outside the inbox."""

    TYPE = "session.synthetic"
    message_id: str
    text: str
    description: str | None = None
    metadata: Mapping[str, Any] | None = None


def stored_type(event: Event | type[Event]) -> str:
    """The versioned type the log stores: ``session.inbox.enqueued.1``."""
    return f"{event.TYPE}.{event.VERSION}"


REGISTRY: Mapping[str, type[Event]] = {
    stored_type(cls): cls
    for cls in (
        SessionCreated,
        SessionRenamed,
        MetadataUpdated,
        AgentSelected,
        ModelSelected,
        SessionDeleted,
        InboxEnqueued,
        InboxDelivered,
        InboxCancelled,
        InboxDeliveryChanged,
        SyntheticRecorded,
    )
}


def encode_data(event: Event) -> bytes:
    """The stored/wire ``data`` member of an event, as JSON bytes."""
    return codec.dumps(event)


def decode_event(type_: str, data: bytes | str) -> Event | None:
    """Decode stored data; None when this build does not know ``type_``."""
    cls = REGISTRY.get(type_)
    if cls is None:
        return None
    return codec.from_json(cls, orjson.loads(data))


def envelope(*, id: str, created: int, event: Event, seq: int | None) -> dict[str, Any]:
    """The public event envelope of ``reference/wire.md``."""
    out: dict[str, Any] = {"id": id, "created": created, "type": event.TYPE}
    if seq is not None:
        out["durable"] = {"aggregateID": event.session_id, "seq": seq, "version": event.VERSION}
    out["data"] = codec.to_json(event)
    return out
