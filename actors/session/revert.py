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

All three are commands of the session's actor (admission, delivery and
revert mutations are serialised by it) and refuse with ``SessionBusy`` while
the session runs here (the actor knows). A new prompt commits a staged revert
in the same transaction that admits it (:meth:`Reverts.commit_events`, called
by the inbox in the prompt's own command).

Files are restored to the snapshot taken before the first step (after the
message) that changed each of them, as OpenCode does; the tree the files are
in at staging is taken (a full look) before anything is touched.

Crash safety: files and log agree after a crash at any point. Before a stage
or clear touches a file, an intent (the revert, the restores it makes, and
the tree the files are in just before: the undo) is written durably to
``<data>/revert/<session>.json``; then the files are restored; only then is
the event recorded, and last the intent is removed. A restore that is
refused (:class:`~actors.files.snapshots.RestoreRefused`: a path would lead outside
the directory, a directory holds files no step wrote) leaves the files as
they were, answers a 409 and records nothing. :meth:`Reverts.recover` (at
start) finishes every intent it finds whose event is in the log (restoring
is idempotent: the same trees, the same paths) and puts the files of the
others back to their undo tree. Staging over a staged revert first clears
it, as its own durable step. The restore itself is confined path by path
(:mod:`actors.files.confined`).

A test hook stops a revert at a chosen point so a test can SIGKILL the real
server there (tests/durability/test_revert_crash.py). It is inert unless the
server's own environment holds ``SESSIONRT_TEST_REVERT_PAUSE=<point>:<marker>``
(nothing over HTTP sets it): at ``<point>`` the revert creates the file
``<marker>`` and waits, holding the session's actor, until the process is killed
(or, in a test that runs the runtime in its own process, until it calls
:meth:`Reverts.resume_paused`). Points: ``stage.intent``
and ``clear.intent`` (the intent is durable, no file restored yet),
``stage.restore`` and ``clear.restore`` (one path restored, the others not),
``stage.event`` and ``clear.event`` (files restored, the event committed, the
intent not yet removed),
and ``commit`` (the commit's events committed, the call not yet answered). A
start's recovery never pauses.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import functools
import logging
import os
from pathlib import Path
from typing import Final

import orjson

from actors.files.snapshots import WRITING_TOOLS, Blocking, RestoreRefused, SnapshotError, Snapshots
from actors.kit import finish
from actors.session.inbox import Doorbell, Owners, Writer, append_session_events
from protocol import codec, ids
from protocol import events as ev
from protocol.cursor import MessageAnchor
from protocol.errors import (
    ConflictError,
    DomainError,
    InvalidRequestError,
    MessageNotFoundError,
    ServiceUnavailableError,
    SessionBusyError,
    SessionNotFoundError,
    UnknownError,
)
from protocol.shapes import AssistantMessage, FileDiff, Session, SessionRevert, ToolPart
from storage import Store

__all__ = ["PAUSE_ENV", "PAUSE_POINTS", "Reverts"]

log = logging.getLogger(__name__)

#: The test hook's variable (see the module docstring); unset in every real deployment.
PAUSE_ENV = "SESSIONRT_TEST_REVERT_PAUSE"
#: Where the test hook can stop a revert.
PAUSE_POINTS: Final = frozenset(
    f"{op}.{where}" for op in ("stage", "clear") for where in ("intent", "event", "restore")
) | {"commit"}


#: The restores of one stage or clear: (tree, the paths made what they are in it).
Restores = list[tuple[str, list[str]]]


class Reverts:
    def __init__(
        self,
        store: Store,
        owners: Owners,
        snapshots: Snapshots,
        *,
        wake: Doorbell,
        intents: Path,
        blocking: Blocking,
    ) -> None:
        self._store = store
        self._owners = owners
        self._snapshots = snapshots
        #: Rung when a clear releases synthetic input the revert held.
        self._wake = wake
        #: Where the intents of stages and clears in progress are kept.
        self._intents = intents
        self._blocking = blocking
        #: The test hook's point and marker file, or None (always, outside tests).
        self._pause = _pause_from(os.environ.get(PAUSE_ENV))
        #: Set by :meth:`resume_paused`: a paused revert goes on (never set by the runtime).
        self._resumed = asyncio.Event()

    async def stage(self, session_id: str, message_id: str, files: bool = False) -> SessionRevert:
        ids.validate("ses", session_id, field="sessionID")
        ids.validate("msg", message_id, field="messageID")

        async def stage(writer: Writer) -> SessionRevert:
            session = await self._idle(session_id, writer)
            seq = await self._store.queries.message_seq(session_id, message_id)
            if seq is None:
                raise MessageNotFoundError(session_id, message_id)
            if session.revert is not None:
                await self._clear(session, session.revert)
            revert, restores = SessionRevert(message_id=message_id), Restores()
            if files:
                revert, restores = await self._plan(session, message_id, seq)
            event = ev.RevertStaged(session_id=session_id, revert=revert)
            await self._durably(session, "stage", revert, restores, revert.snapshot, event)
            return revert

        staged: SessionRevert = await self._owners.command(session_id, stage)
        return staged

    async def clear(self, session_id: str) -> None:
        ids.validate("ses", session_id, field="sessionID")

        async def clear(writer: Writer) -> builtins.list[str]:
            session = await self._idle(session_id, writer)
            if session.revert is None:
                return []
            held = await self._store.queries.held_synthetic(session_id)
            await self._clear(session, session.revert)
            return held

        held: builtins.list[str] = await self._owners.command(session_id, clear)
        if held:
            # What the revert held is input like any other now: it delivers.
            self._wake.wake(session_id, "input")

    async def recover(self) -> int:
        """Finish (or drop) every stage or clear a crash interrupted; how many were finished."""
        finished = 0
        for path in await self._blocking(_intent_files, self._intents):
            try:
                intent = orjson.loads(await self._blocking(path.read_bytes))
                session_id = intent["session"]
                revert = codec.from_json(SessionRevert, intent["revert"])
                restores: Restores = [(t, list(f)) for t, f in intent["restores"]]
                undo: str | None = intent.get("undo")
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("dropping unreadable revert intent %s: %s", path.name, exc)
                await self._blocking(_unlink, path)
                continue
            finish_one = functools.partial(
                self._recover_one, session_id, intent["op"], revert, restores, undo, path
            )
            finished += await self._owners.command(session_id, finish_one)
        return finished

    async def _recover_one(
        self,
        session_id: str,
        op: str,
        revert: SessionRevert,
        restores: Restores,
        undo: str | None,
        path: Path,
        _: Writer,
    ) -> bool:
        """Finish (or undo) one interrupted stage or clear: a command of its session."""
        session = await self._store.queries.session(session_id)
        current = None if session is None else session.revert
        # The files may be half restored. Its event committed: finish them;
        # it did not: put them back as they were before (the undo tree).
        done = current == revert if op == "stage" else current != revert
        if session is not None:
            try:
                if done:
                    await self._apply(session, restores)
                elif undo is not None:
                    await self._apply(session, [(undo, _paths(restores))])
            except DomainError as exc:
                log.warning("revert of %s not finished: %s", session_id, exc)
                return False  # the intent stays for the next start
        await self._blocking(_unlink, path)
        return session is not None

    async def commit(self, session_id: str) -> None:
        ids.validate("ses", session_id, field="sessionID")

        async def commit(writer: Writer) -> None:
            session = await self._idle(session_id, writer)
            events = await self.commit_events(session)
            if events:
                await self._append(session_id, *events)
                await self._paused("commit")

        await self._owners.command(session_id, commit)

    async def commit_events(self, session: Session) -> builtins.list[ev.Event]:
        """The events that commit ``session``'s staged revert (none if none is staged).

        The caller is a command of the session's actor and appends them, alone
        or with the admission they precede.
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
        *,
        message_id: str | None = None,
    ) -> builtins.list[FileDiff]:
        """File diffs between the snapshots before two user messages, or of one step.

        ``from`` left out: the session's first snapshot; ``to`` left out: the
        files as they are now. ``message_id`` (an assistant message, not with
        ``from``/``to``): what that step changed (see :meth:`step_diff`).
        """
        if context < 0:
            raise InvalidRequestError("context must be a non-negative integer", field="context")
        for value, field in ((from_id, "from"), (to_id, "to"), (message_id, "messageID")):
            if value is not None:
                ids.validate("msg", value, field=field)
        if message_id is not None:
            if from_id is not None or to_id is not None:
                raise InvalidRequestError(
                    "messageID (one step) does not go with from/to (between prompts)",
                    field="messageID",
                )
            return await self.step_diff(session_id, message_id, context)
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

    async def step_diff(
        self, session_id: str, message_id: str, context: int = 3
    ) -> builtins.list[FileDiff]:
        """The files the step of assistant message ``message_id`` changed, with their diff.

        From the step's own snapshots (``before`` and ``snapshot`` of its
        ``step.ended``/``step.failed``), only its ``files``: nothing the user
        or a later step did. A step that recorded no snapshot (no writing
        tool ran, no git work tree, not ended yet) changed nothing: ``[]``.
        The message is looked up in this session only (another session's id
        is a 404); a user or other non-step message is a 400.
        """
        session = await self._session(session_id)
        message = await self._store.queries.message(session_id, message_id)
        if message is None:
            raise MessageNotFoundError(session_id, message_id)
        if not isinstance(message, AssistantMessage):
            raise InvalidRequestError(
                f"messageID must name an assistant message (a step), not a {message.type}"
                " message; a prompt's changes are from=<it>&to=<the next prompt>",
                field="messageID",
            )
        step = await self._store.queries.step_snapshot(session_id, message_id, message.seq)
        if step is None:
            return []
        before, after, files = step
        directory = session.location.directory
        try:
            if not await self._snapshots.has_trees(directory, [before, after]):
                raise ConflictError(
                    "the step's snapshots were taken in another directory (the session"
                    " moved since)",
                    resource="files",
                )
            return await self._snapshots.diff(
                directory, before, after, context=context, only=frozenset(files)
            )
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
        if message_id is None and field == "to":
            return None
        rows = await self._store.queries.step_snapshots(session_id, seq)
        # The first writing step after the message: the tree before it ran.
        return rows[0][1] if rows else None

    async def _plan(
        self, session: Session, message_id: str, seq: int
    ) -> tuple[SessionRevert, Restores]:
        """The revert of the files the steps after ``seq`` changed, and its restores.

        Refused (409, nothing written) when the files cannot be restored: a
        step that ran a writing tool has no snapshot (the directory is not in
        a git work tree, or its snapshot failed), or the snapshots are not in
        the store of the session's directory (it moved since).
        """
        # Each path goes back to how it was before the first step that changed it.
        first: dict[str, str] = {}
        rows = await self._store.queries.step_snapshots(session.id, seq)
        for _, before, _, changed in rows:
            for path in changed:
                first.setdefault(path, before)
        if await self._writing_steps(session.id, message_id, seq) > len(rows):
            raise ConflictError(
                "the files cannot be restored: a step after the message changed files"
                " without a snapshot (no git work tree, or its snapshot failed)",
                resource="files",
            )
        if not first:
            return SessionRevert(message_id=message_id), []
        directory = session.location.directory
        try:
            moved = not await self._snapshots.has_trees(directory, sorted(set(first.values())))
        except SnapshotError as exc:
            raise ServiceUnavailableError(f"snapshot store: {exc}", service="snapshots") from None
        if moved:
            raise ConflictError(
                "the files cannot be restored: their snapshots were taken in another"
                " directory (the session moved since)",
                resource="files",
            )
        current = await self._track(session)
        if current is None:
            raise ConflictError(
                f"the files cannot be restored: {directory} is no longer in a git work tree",
                resource="files",
            )
        by_tree: dict[str, list[str]] = {}
        for path, tree in sorted(first.items()):
            by_tree.setdefault(tree, []).append(path)
        revert = SessionRevert(message_id=message_id, snapshot=current, files=tuple(sorted(first)))
        return revert, list(by_tree.items())

    async def _writing_steps(self, session_id: str, message_id: str, seq: int) -> int:
        """Assistant messages after ``seq`` whose writing tools ran (not refused ones)."""
        count = 0
        anchor = MessageAnchor(id=message_id, seq=seq, direction="next")
        while True:
            page = await self._store.queries.messages(session_id, "asc", 200, anchor)
            for m in page.data:
                if isinstance(m, AssistantMessage) and any(_ran_writing(p) for p in m.parts):
                    count += 1
            if page.cursor.next is None or not page.data:
                return count
            last = page.data[-1]
            anchor = MessageAnchor(id=last.id, seq=last.seq, direction="next")

    async def _clear(self, session: Session, revert: SessionRevert) -> None:
        restores: Restores = []
        undo = None
        if revert.snapshot is not None and revert.files:
            restores = [(revert.snapshot, list(revert.files))]
            undo = await self._track(session)
        event = ev.RevertCleared(session_id=session.id)
        await self._durably(session, "clear", revert, restores, undo, event)

    async def _durably(
        self,
        session: Session,
        op: str,
        revert: SessionRevert,
        restores: Restores,
        undo: str | None,
        event: ev.Event,
    ) -> None:
        """Intent, files, event, intent gone: a crash anywhere leaves files and log agreeing.

        The files change before the event is appended, so a restore that is
        refused (files put back as they were) leaves the log untouched too.
        """
        if not restores:
            await self._append(session.id, event)
            return
        path = self._intents / f"{session.id}.json"
        intent = {
            "op": op,
            "session": session.id,
            "revert": codec.to_json(revert),
            "restores": restores,
            "undo": undo,
        }
        await self._blocking(_write_durably, path, orjson.dumps(intent))
        await self._paused(f"{op}.intent")
        # Held to the end even if the caller is cancelled (its client went away): the
        # lock must outlive the restore, or a prompt could commit the revert (or a step
        # write) while files are half restored.
        await finish(self._finish(session, op, revert, restores, undo, path, event))

    async def _finish(
        self,
        session: Session,
        op: str,
        revert: SessionRevert,
        restores: Restores,
        undo: str | None,
        path: Path,
        event: ev.Event,
    ) -> None:
        directory = session.location.directory
        try:
            if self._pause is not None and self._pause[0] == f"{op}.restore":
                # The test hook: one path back (the last: the deepest, which any
                # plan may restore alone), the others not yet.
                tree, paths = restores[-1]
                await self._snapshots.restore(directory, [(tree, paths[-1:])], undo=undo)
                await self._paused(f"{op}.restore")
            await self._snapshots.restore(directory, restores, undo=undo)
        except SnapshotError as exc:
            if not (isinstance(exc, RestoreRefused) and exc.changed):
                # Refused with the files as they were: no intent left to recover.
                # Otherwise they may be half restored: the intent stays for recovery.
                await self._blocking(_unlink, path)
            raise _domain(exc) from None
        try:
            await self._append(session.id, event)
        except BaseException:
            # Refused (or cut off) around the commit: the log decides, as at recovery.
            recorded = None
            with contextlib.suppress(Exception):
                recorded = await self._recorded(session.id, op, revert)
            if recorded is False and undo is not None:
                with contextlib.suppress(DomainError):
                    await self._apply(session, [(undo, _paths(restores))])
                    await self._blocking(_unlink, path)
            raise
        await self._paused(f"{op}.event")
        await self._blocking(_unlink, path)

    async def _recorded(self, session_id: str, op: str, revert: SessionRevert) -> bool:
        session = await self._store.queries.session(session_id)
        current = None if session is None else session.revert
        return current == revert if op == "stage" else current != revert

    async def _apply(self, session: Session, restores: Restores, undo: str | None = None) -> None:
        try:
            await self._snapshots.restore(session.location.directory, restores, undo=undo)
        except SnapshotError as exc:
            raise _domain(exc) from None

    async def _track(self, session: Session) -> str | None:
        try:
            return await self._snapshots.track(session.location.directory)
        except SnapshotError as exc:
            raise ServiceUnavailableError(f"snapshot store: {exc}", service="snapshots") from None

    def resume_paused(self) -> None:
        """The test hook: a revert paused at its point (and any later one) goes on. For a
        test that runs the runtime in its own process; one with a server kills it."""
        self._resumed.set()

    async def _paused(self, point: str) -> None:
        """The test hook: at its point, say so in the marker file and wait for
        :meth:`resume_paused`, which nothing but a test calls."""
        if self._pause is None or self._pause[0] != point:
            return
        await self._blocking(_write_durably, self._pause[1], point.encode())
        log.warning("revert paused at %s (%s is set)", point, PAUSE_ENV)
        # Until the test kills the process (or resumes it), even if the call is cancelled
        # meanwhile: at these points the real code has no await a cancellation could land
        # on, so one here must not let go of the lock (a prompt could then commit a revert
        # whose files were never restored, a state no real run reaches).
        await finish(self._resumed.wait())

    async def _session(self, session_id: str) -> Session:
        ids.validate("ses", session_id, field="sessionID")
        session = await self._store.queries.session(session_id)
        if session is None:
            raise SessionNotFoundError(session_id)
        return session

    async def _idle(self, session_id: str, writer: Writer) -> Session:
        session = await self._session(session_id)
        if writer.busy:
            raise SessionBusyError(session_id)
        return session

    async def _append(self, session_id: str, *events: ev.Event) -> None:
        await append_session_events(self._store, session_id, *events)


#: Tool errors that mean the call never ran (so it changed no file).
_NOT_RUN: Final = ("permission.", "tool.disabled", "unknown-tool", "invalid-input")


def _ran_writing(part: object) -> bool:
    if not isinstance(part, ToolPart) or part.name not in WRITING_TOOLS:
        return False
    if part.status == "completed":
        return True
    kind = str((part.error or {}).get("type", ""))
    return part.status == "error" and not kind.startswith(_NOT_RUN)


def _domain(exc: SnapshotError) -> DomainError:
    """A restore's failure as the caller sees it: refused (409) or the store broken (503)."""
    if isinstance(exc, RestoreRefused):
        return ConflictError(f"the files cannot be restored: {exc}", resource="files")
    return ServiceUnavailableError(f"snapshot store: {exc}", service="snapshots")


def _paths(restores: Restores) -> list[str]:
    return sorted({p for _, paths in restores for p in paths})


def _pause_from(value: str | None) -> tuple[str, Path] | None:
    if not value:
        return None
    point, sep, marker = value.partition(":")
    if not sep or point not in PAUSE_POINTS or not marker:
        raise ValueError(
            f"{PAUSE_ENV} must be <point>:<marker file>, point one of {sorted(PAUSE_POINTS)}"
        )
    return point, Path(marker)


def _intent_files(directory: Path) -> list[Path]:
    """The intents to finish or drop, after removing the torn ones.

    A kill inside an intent's write leaves only its temporary file; the event
    comes after the rename, so it never committed and no file was touched.
    """
    try:
        entries = list(directory.iterdir())
    except FileNotFoundError:
        return []
    for path in entries:
        if path.suffix == ".tmp":
            log.warning("dropping torn revert intent %s", path.name)
            _unlink(path)
    return sorted(p for p in entries if p.suffix == ".json")


def _write_durably(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
