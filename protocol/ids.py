"""Prefixed, time-ascending identifiers.

An id is ``<prefix>_<body>``. The body starts with 14 hex digits holding
``(epoch_ms << 12) | counter`` followed by 14 random base62 characters, so ids
sort by creation time as plain strings. Within one process ids are strictly
increasing even when many are minted inside one millisecond: the counter runs
on, and when it would overflow the clock is advanced artificially (a burst of
more than 4,096 ids in a millisecond borrows from the next one).

Client-supplied ids are only checked for their prefix and a conservative
character set; their body need not follow our layout.
"""

from __future__ import annotations

import os
import re
import threading
import time
from typing import Final, Literal

from protocol.errors import InvalidRequestError

__all__ = [
    "IdKind",
    "ascending",
    "event_id",
    "is_valid",
    "message_id",
    "pattern",
    "session_id",
    "tool_output_id",
    "validate",
]

IdKind = Literal["ses", "msg", "evt", "tool", "per"]

_PREFIXES: Final[dict[IdKind, str]] = {
    "ses": "ses_",
    "msg": "msg_",
    "evt": "evt_",
    "tool": "tool_",
    "per": "per_",
}
_BASE62: Final = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
# Maps every byte to a base62 character in one C-level translate(); a modulo
# bias of 4/256 is irrelevant since the tail only breaks ties across processes.
_TO_BASE62: Final = bytes(ord(_BASE62[b % 62]) for b in range(256))
_COUNTER_BITS: Final = 12
_BODY: Final = re.compile(r"[0-9A-Za-z_-]{1,100}")


def pattern(kind: IdKind) -> str:
    """The JSON Schema ``pattern`` of a valid id of ``kind`` (for the OpenAPI document)."""
    return f"^{_PREFIXES[kind]}{_BODY.pattern}$"


_TAIL: Final = 14
#: Random bytes drawn from the OS at once, turned into base62 text at once and
#: sliced 14 characters per id. One ``urandom`` call per id released and
#: retook the GIL each time: with the store's threads busy, the loop waited
#: for the GIL on every id (several per step). Translating the whole pool in
#: one call rather than each tail on its own halves the cost of an id.
_POOL_BYTES: Final = _TAIL * 256

_lock = threading.Lock()
_last = 0
_pool = ""
_offset = 0


def _reset_pool() -> None:
    """A forked child draws its own bytes: sharing the parent's would repeat tails."""
    global _pool, _offset
    _pool, _offset = "", 0


os.register_at_fork(after_in_child=_reset_pool)


def _body() -> str:
    """The next body: the stamp in hex, then 14 random base62 characters, under one lock."""
    global _last, _pool, _offset
    now = time.time_ns() // 1_000_000 << _COUNTER_BITS
    with _lock:
        # Strictly increasing across clock steps backwards as well as inside
        # one millisecond.
        _last = stamp = now if now > _last else _last + 1
        start = _offset
        if start + _TAIL > len(_pool):
            _pool, start = os.urandom(_POOL_BYTES).translate(_TO_BASE62).decode("ascii"), 0
        _offset = start + _TAIL
        tail = _pool[start : start + _TAIL]
    return f"{stamp:012x}{tail}"


def ascending(kind: IdKind) -> str:
    """Mint a new id of ``kind``; later calls in this process sort after it."""
    return _PREFIXES[kind] + _body()


def session_id() -> str:
    return ascending("ses")


def message_id() -> str:
    return ascending("msg")


def event_id() -> str:
    return "evt_" + _body()  # the one minted for every event: no prefix lookup


def tool_output_id() -> str:
    return ascending("tool")


def permission_id() -> str:
    return ascending("per")


def is_valid(kind: IdKind, value: str) -> bool:
    prefix = _PREFIXES[kind]
    return value.startswith(prefix) and _BODY.fullmatch(value[len(prefix) :]) is not None


def validate(kind: IdKind, value: object, *, field: str) -> str:
    """Return ``value`` if it is a well-formed id of ``kind``, else raise InvalidRequestError."""
    if not isinstance(value, str) or not is_valid(kind, value):
        raise InvalidRequestError(
            f"{field} must be an id starting with {_PREFIXES[kind]!r}",
            kind="id",
            field=field,
        )
    return value
