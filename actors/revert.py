"""Revert (``SessionRevert``): stage, clear and commit, and session diffs.

``stage(messageID, files)`` hides the transcript from that message on (the
message included: the session goes back to before it) and, with ``files``,
restores the files the later steps changed to the snapshot taken before the
first of them. The tree the files were in at staging is recorded on the
revert, so ``clear`` puts them back byte for byte; ``commit`` makes it
permanent: the hidden rows leave the projections (never the log), pending
synthetic input admitted while it was staged is discarded, and instruction
state is cleared (by the instruction projection, on
``session.revert.committed``).

All three hold the session's inbox lock (admission, delivery and revert
mutations are serialised) and refuse with ``SessionBusy`` while the session
runs here. A new prompt commits a staged revert in the same transaction that
admits it (:meth:`Reverts.commit_events`, called by the inbox under the lock).

Files are restored before ``session.revert.staged`` is recorded: a crash in
between leaves the files restored and no revert staged; a clear is then not
possible, but nothing admitted is lost.
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable

from actors._keyed_lock import KeyedLock
from actors.snapshots import SnapshotError, Snapshots
from protocol import events as ev
from protocol import ids
from protocol.errors import (
    ConflictError,
    InvalidRequestError,
    MessageNotFoundError,
    SessionBusyError,
    SessionNotFoundError,
    UnknownError,
)
from protocol.shapes import FileDiff, Session, SessionRevert
from storage import Command, ProjectionConflict, Store

__all__ = ["Reverts"]

Busy = Callable[[str], Awaitable[bool]]


async def _never_busy(session_id: str) -> bool:
    return False


class Reverts:
    def __init__(
        self,
        store: Store,
        locks: KeyedLock,
        snapshots: Snapshots,
        busy: Busy = _never_busy,
    ) -> None:
        self._store = store
        self._locks = locks
        self._snapshots = snapshots
        self.busy = busy

    async def stage(self, session_id: str, message_id: str, files: bool = False) -> SessionRevert:
        ids.validate("msg", message_id, field="messageID")
        async with self._locks.hold(session_id):
            session = await self._idle(session_id)
            seq = await self._store.queries.message_seq(session_id, message_id)
            if seq is None:
                raise MessageNotFoundError(session_id, message_id)
            if session.revert is not None:
                await self._restore_staged(session)
            revert = SessionRevert(message_id=message_id)
            if files:
                revert = await self._restore_files(session, message_id, seq)
            await self._append(session_id, ev.RevertStaged(session_id=session_id, revert=revert))
            return revert

    async def clear(self, session_id: str) -> None:
        async with self._locks.hold(session_id):
            session = await self._idle(session_id)
            if session.revert is None:
                return
            await self._restore_staged(session)
            await self._append(session_id, ev.RevertCleared(session_id=session_id))

    async def commit(self, session_id: str) -> None:
        async with self._locks.hold(session_id):
            session = await self._idle(session_id)
            events = await self.commit_events(session)
            if events:
                await self._append(session_id, *events)

    async def commit_events(self, session: Session) -> builtins.list[ev.Event]:
        """The events that commit ``session``'s staged revert (none if none is staged).

        The caller holds the session's inbox lock and appends them, alone or
        with the admission they precede.
        """
        if session.revert is None:
            return []
        held = await self._store.queries.held_synthetic(session.id)
        return [
            *(ev.InboxCancelled(session_id=session.id, inbox_id=i) for i in held),
            ev.RevertCommitted(session_id=session.id, to=session.revert.message_id),
        ]

    async def diff(
        self,
        session_id: str,
        from_id: str | None = None,
        to_id: str | None = None,
        context: int = 3,
    ) -> builtins.list[FileDiff]:
        """File diffs between the snapshots before two user messages.

        ``from`` left out: the session's first snapshot; ``to`` left out: the
        files as they are now.
        """
        if context < 0:
            raise InvalidRequestError("context must be a non-negative integer", field="context")
        session = await self._session(session_id)
        directory = session.location.directory
        try:
            start = await self._snapshot_at(session_id, from_id, "from")
            if start is None:
                return []
            end = await self._snapshot_at(session_id, to_id, "to")
            if end is None:
                end = await self._snapshots.track(directory)
            if end is None:
                return []
            return await self._snapshots.diff(directory, start, end, context=context)
        except SnapshotError as exc:
            raise UnknownError(f"snapshot store: {exc}") from None

    # -- helpers --------------------------------------------------------------------------------

    async def _snapshot_at(self, session_id: str, message_id: str | None, field: str) -> str | None:
        seq = 0
        if message_id is not None:
            ids.validate("msg", message_id, field=field)
            found = await self._store.queries.message_seq(session_id, message_id)
            if found is None:
                raise MessageNotFoundError(session_id, message_id)
            seq = found
        rows = await self._store.queries.step_snapshots(session_id, seq)
        if message_id is None and field == "to":
            return None
        # The first snapshot recorded after the message: the tree before its steps ran.
        return rows[0][1] if rows else None

    async def _restore_files(self, session: Session, message_id: str, seq: int) -> SessionRevert:
        rows = await self._store.queries.step_snapshots(session.id, seq)
        if not rows:
            return SessionRevert(message_id=message_id)
        before = rows[0][1]
        assert before is not None
        changed = sorted({f for _, _, files in rows for f in files})
        directory = session.location.directory
        try:
            current = await self._snapshots.track(directory)
            if current is None:
                return SessionRevert(message_id=message_id)
            # Only paths the steps changed come back; the rest is left alone.
            await self._snapshots.restore(directory, before, changed)
        except SnapshotError as exc:
            raise UnknownError(f"snapshot store: {exc}") from None
        return SessionRevert(message_id=message_id, snapshot=current, files=tuple(changed))

    async def _restore_staged(self, session: Session) -> None:
        revert = session.revert
        if revert is None or revert.snapshot is None or not revert.files:
            return
        try:
            await self._snapshots.restore(session.location.directory, revert.snapshot, revert.files)
        except SnapshotError as exc:
            raise UnknownError(f"snapshot store: {exc}") from None

    async def _session(self, session_id: str) -> Session:
        ids.validate("ses", session_id, field="sessionID")
        session = await self._store.queries.session(session_id)
        if session is None:
            raise SessionNotFoundError(session_id)
        return session

    async def _idle(self, session_id: str) -> Session:
        session = await self._session(session_id)
        if await self.busy(session_id):
            raise SessionBusyError(session_id)
        return session

    async def _append(self, session_id: str, *events: ev.Event) -> None:
        try:
            await self._store.append(Command.of(*events))
        except ProjectionConflict as exc:
            if exc.reason == "session.missing":
                raise SessionNotFoundError(session_id) from None
            raise ConflictError(str(exc), resource="session") from None
