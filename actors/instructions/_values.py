"""Instruction keys, the canonical encoding of a value and its content hash."""

from __future__ import annotations

import hashlib
import re
import threading
from typing import Any, Final

import orjson

__all__ = [
    "ENTRY_KEY",
    "ENTRY_MAX_BYTES",
    "KEY",
    "HashCache",
    "digest",
    "encode",
]

#: A source key: ``namespace/rest`` (reference §4.9).
KEY: Final = re.compile(r"^[a-z0-9][a-z0-9._-]*/[a-z0-9][a-z0-9._/-]*$")
#: An API entry's client key (slash-free); its source key is ``api/<key>``.
ENTRY_KEY: Final = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
#: The largest serialised entry value accepted (the newer reference snapshot).
ENTRY_MAX_BYTES: Final = 256 * 1024


def encode(value: Any) -> bytes:
    """The canonical JSON of ``value``: sorted keys, no whitespace."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def digest(encoded: bytes) -> str:
    return hashlib.sha256(encoded).hexdigest()


class HashCache:
    """The last encoded value and hash per source key, so an unchanged value is not rehashed.

    Bounded by count (:attr:`max_entries`) and by the bytes of the values it
    holds (:attr:`max_bytes`); over either, it starts again empty. Comparing
    two equal byte strings costs a memcmp, a fraction of hashing them.
    """

    def __init__(self, max_entries: int = 4096, max_bytes: int = 16 * 1024 * 1024) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: dict[tuple[str, str], tuple[bytes, str]] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def digest(self, scope: str, key: str, encoded: bytes) -> str:
        with self._lock:
            hit = self._entries.get((scope, key))
        if hit is not None and hit[0] == encoded:
            return hit[1]
        value = digest(encoded)
        with self._lock:
            if (
                len(self._entries) >= self.max_entries
                or self._bytes + len(encoded) > self.max_bytes
            ):
                self._entries.clear()
                self._bytes = 0
            old = self._entries.get((scope, key))
            if old is not None:
                self._bytes -= len(old[0])
            self._entries[(scope, key)] = (encoded, value)
            self._bytes += len(encoded)
        return value
