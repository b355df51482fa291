"""API-managed instruction entries: one ``api/<key>`` source each.

A session holds at most ``MAX_ENTRIES`` entries of ``MAX_TOTAL_BYTES`` in
all (each value at most ``ENTRY_MAX_BYTES``): every entry is sent to the
model at every step, and 2,000 entries of 60 kB once made the next prompt
take 94 s. A put beyond either is a 413 (``InstructionEntriesFullError``).
A put or remove is a command of the session's actor, so the check of the
limits and the write cannot be split by another put.

Entries are primary state (``instruction_entry``), written through the store's
single writer but not as events: a change is announced at the session's next
Safe Step Boundary, when admission finds the new value. Put is an upsert that
changes nothing when the value is the same; remove is a soft delete; the list
leaves removed keys out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import orjson

from actors.instructions._values import ENTRY_KEY, ENTRY_MAX_BYTES, encode
from protocol import ids
from protocol.errors import (
    InstructionEntriesFullError,
    InstructionEntryValueTooLargeError,
    InvalidRequestError,
    SessionNotFoundError,
)
from protocol.shapes import InstructionEntry
from storage import Command, EntryWrite, Store

if TYPE_CHECKING:
    from actors.session.inbox import Owners, Writer

__all__ = ["MAX_ENTRIES", "MAX_TOTAL_BYTES", "InstructionEntries"]

#: Entries one session may hold, and their values' bytes in all.
MAX_ENTRIES: Final = 100
MAX_TOTAL_BYTES: Final = 1024 * 1024


class InstructionEntries:
    def __init__(
        self,
        store: Store,
        owners: Owners,
        *,
        max_value_bytes: int = ENTRY_MAX_BYTES,
        max_entries: int = MAX_ENTRIES,
        max_total_bytes: int = MAX_TOTAL_BYTES,
    ) -> None:
        self._store = store
        self._owners = owners
        self.max_value_bytes = max_value_bytes
        self.max_entries = max_entries
        self.max_total_bytes = max_total_bytes

    async def list(self, session_id: str) -> list[InstructionEntry]:
        await self._require(session_id)
        rows = await self._store.queries.instruction_entries(session_id)
        return [InstructionEntry(key=k, value=orjson.loads(v)) for k, v in rows]

    async def put(self, session_id: str, key: str, value: Any) -> None:
        _check_key(key)
        try:
            encoded = encode(value)
        except TypeError as exc:  # e.g. an integer beyond 64 bits
            raise InvalidRequestError(f"value is not storable JSON: {exc}", field="value") from None
        if len(encoded) > self.max_value_bytes:
            raise InstructionEntryValueTooLargeError(len(encoded), self.max_value_bytes)
        ids.validate("ses", session_id, field="sessionID")
        write = EntryWrite(session_id=session_id, key=key, value=encoded.decode())

        async def put(_: Writer) -> None:
            await self._require(session_id)
            others = [
                len(v.encode())
                for k, v in await self._store.queries.instruction_entries(session_id)
                if k != key
            ]
            if (
                len(others) + 1 > self.max_entries
                or sum(others) + len(encoded) > self.max_total_bytes
            ):
                raise InstructionEntriesFullError(self.max_entries, self.max_total_bytes)
            await self._store.append(Command(events=(), entries=(write,)))

        await self._owners.command(session_id, put)

    async def remove(self, session_id: str, key: str) -> None:
        _check_key(key)
        ids.validate("ses", session_id, field="sessionID")
        write = EntryWrite(session_id=session_id, key=key, value=None, removed=True)

        async def remove(_: Writer) -> None:
            await self._require(session_id)
            await self._store.append(Command(events=(), entries=(write,)))

        await self._owners.command(session_id, remove)

    async def _require(self, session_id: str) -> None:
        ids.validate("ses", session_id, field="sessionID")
        if await self._store.queries.session(session_id) is None:
            raise SessionNotFoundError(session_id)


def _check_key(key: str) -> None:
    if not ENTRY_KEY.fullmatch(key):
        raise InvalidRequestError("an entry key matches ^[a-z0-9][a-z0-9._-]*$", field="key")
