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
    """The content hash of recently seen encoded values, so an unchanged value is not rehashed.

    Keyed by the encoded bytes themselves, not by session: sessions that
    share a value (the same system prompt, the same ``AGENTS.md``) share one
    entry, so an idle session keeps nothing here (keyed by session, each
    kept a copy of every value it had seen, some 4 KB per session). A lookup
    costs Python's hash of the bytes and a compare, a fraction of SHA-256.

    Bounded by count (:attr:`max_entries`) and by the bytes of the values it
    holds (:attr:`max_bytes`); over either, it starts again empty.
    """

    def __init__(self, max_entries: int = 4096, max_bytes: int = 16 * 1024 * 1024) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: dict[bytes, str] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def digest(self, encoded: bytes) -> str:
        with self._lock:
            hit = self._entries.get(encoded)
        if hit is not None:
            return hit
        value = digest(encoded)
        with self._lock:
            if encoded not in self._entries:
                if (
                    len(self._entries) >= self.max_entries
                    or self._bytes + len(encoded) > self.max_bytes
                ):
                    self._entries.clear()
                    self._bytes = 0
                self._entries[encoded] = value
                self._bytes += len(encoded)
        return value

    def __len__(self) -> int:
        return len(self._entries)
