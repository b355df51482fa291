"""Opaque list cursors.

A cursor is base64url (unpadded) JSON of the query it continues plus an
anchor: the row it starts after and the direction. Clients treat it as an
opaque string; a continuation takes only the cursor, so everything needed to
continue (filters, order, page size) travels inside it. Anything that fails to
decode is :class:`~protocol.errors.InvalidCursorError`.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Literal, TypeVar

import attrs
import orjson

from protocol import codec
from protocol.errors import InvalidCursorError, InvalidRequestError
from protocol.shapes import Order

__all__ = [
    "Direction",
    "MessageAnchor",
    "MessageCursor",
    "SessionAnchor",
    "SessionCursor",
    "SessionQuery",
    "decode_cursor",
    "encode_cursor",
]

C = TypeVar("C")

Direction = Literal["previous", "next"]


@attrs.frozen(kw_only=True)
class SessionAnchor:
    id: str
    time: int
    direction: Direction


@attrs.frozen(kw_only=True)
class SessionQuery:
    """The fixed part of a ``session.list`` query: filters, order, page size."""

    order: Order = "desc"
    limit: int = 50
    search: str | None = None
    parent_id: str | None = None
    #: Only sessions without a parent (``parentID=null`` on the wire).
    roots: bool = False


@attrs.frozen(kw_only=True)
class SessionCursor:
    """Continues ``session.list``: the query plus where the last page ended."""

    query: SessionQuery
    anchor: SessionAnchor


@attrs.frozen(kw_only=True)
class MessageAnchor:
    id: str
    seq: int
    direction: Direction


@attrs.frozen(kw_only=True)
class MessageCursor:
    """Continues ``session.messages`` of one session."""

    session_id: str
    order: Order
    limit: int
    anchor: MessageAnchor


def encode_cursor(cursor: Any) -> str:
    raw = orjson.dumps(codec.to_json(cursor))
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode_cursor(cls: type[C], text: str) -> C:
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        data = orjson.loads(raw)
        return codec.from_json(cls, data)
    except (binascii.Error, ValueError, InvalidRequestError, UnicodeError):
        raise InvalidCursorError() from None
