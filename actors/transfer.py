"""Sessions as documents: export, import, and the statistics over all of them.

An export is ``{info, messages}``: the session and its whole transcript in
the public shapes. ``sanitize`` blanks what may be private content (the
bytes of attached files, the outputs of tool calls) and keeps the structure.

An import records the document as events (``session.created`` and one
``session.message.imported`` per message, then the document's usage totals as
``session.usage.recorded``, in one command), so it is durable,
replayable and visible in the session's log like anything else. The session
keeps the document's id (taken, even by a deleted session: 409), as a create
with an id would; messages get fresh ids (a copy of a session imported next
to its original must not collide with it) and the seqs of their import
events, and keep their text, parts, usage and times.
"""

from __future__ import annotations

import asyncio
import builtins
import functools
import logging
import math
from collections.abc import Sequence
from typing import Any, Final

import attrs

from actors.collector import collector_paused
from actors.files.locations import DirectoryRules
from actors.lease_keeper import LeaseKeeper
from actors.session.inbox import Blocking, Writer
from actors.sessions import Sessions
from protocol import codec, ids
from protocol import events as ev
from protocol.errors import ConflictError, InvalidRequestError
from protocol.shapes import (
    AssistantMessage,
    CacheTokens,
    ModelRef,
    ModelUsage,
    ReasoningPart,
    Session,
    SessionExport,
    SessionMessage,
    SessionStats,
    SystemMessage,
    TextPart,
    Tokens,
    ToolPart,
    UserMessage,
)
from storage import AppendConflictError, Command, LeaseHeldError, LeaseUse, Store, now_ms

__all__ = ["IMPORT_CHUNK_EVENTS", "SessionTransfer", "sanitized"]

log = logging.getLogger(__name__)

#: Events per command of an import (see :meth:`SessionTransfer._record`): a
#: few thousand rows, tens of milliseconds of the writer, so the appends of
#: other sessions wait no longer than that.
IMPORT_CHUNK_EVENTS: Final = 500


class SessionTransfer:
    def __init__(
        self,
        store: Store,
        sessions: Sessions,
        *,
        directories: DirectoryRules,
        blocking: Blocking,
        allow_scripts: bool = False,
        leases: LeaseKeeper | None = None,
        chunk_events: int = IMPORT_CHUNK_EVENTS,
    ) -> None:
        if chunk_events < 2:
            raise ValueError("an import's commands hold at least two events")
        self._store = store
        #: Whose lease an import in several commands takes (None: no leases, one host).
        self._leases = leases
        self._chunk_events = chunk_events
        #: Sessions this process is importing now (the sweep leaves them alone).
        self._importing: set[str] = set()
        #: ``[runtime] import_scripts``: keep an imported session's ``metadata.script``.
        self._allow_scripts = allow_scripts
        self._sessions = sessions
        #: Each command of an import is one of the new session's actor.
        self._owners = sessions.owners
        self._directories = directories
        self._blocking = blocking

    async def export(self, session_id: str, *, sanitize: bool = False) -> SessionExport:
        info = await self._sessions.get(session_id)
        messages = tuple(await self._store.queries.context(session_id))
        if sanitize:
            messages = tuple(sanitized(m) for m in messages)
        return SessionExport(info=info, messages=messages)

    async def import_(self, document: SessionExport, *, directory: str | None = None) -> Session:
        """Create the session ``document`` describes; its id taken is a 409."""
        info = await self._checked_info(document.info, directory)
        with collector_paused():
            held: builtins.list[Any] = [await self._blocking(_imported, info.id, document.messages)]
            try:
                return await self._record(info, held)
            finally:
                # Millions of objects: freed on a thread, not in one go on the loop.
                await self._blocking(held.clear)

    async def import_json(self, data: Any, *, directory: str | None = None) -> Session:
        """:meth:`import_` of a document still in JSON (the route's, parsed off the loop).

        Checked in order of cost, so an invalid document is refused before the
        work of its valid part: its shape, then ``info`` as a create checks it
        (on the loop: small), then every message (on a thread: 200,000 of them
        take seconds), and only then anything is built or written.
        """
        if not isinstance(data, dict):
            raise InvalidRequestError("the document must be an object", field="info")
        for key in data:
            if key not in ("info", "messages"):
                raise InvalidRequestError(f"unknown field {key}", kind="unknown", field=key)
        raw_messages = data.get("messages", [])
        if not isinstance(raw_messages, list):
            raise InvalidRequestError("messages must be an array", field="messages")
        decoded = codec.from_json(Session, data.get("info"), path="info", strict=True)
        info = await self._checked_info(decoded, directory)
        with collector_paused():
            held: builtins.list[Any] = [await self._blocking(_imported_json, info.id, raw_messages)]
            try:
                return await self._record(info, held)
            finally:
                # Millions of objects: freed on a thread, not in one go on the loop.
                await self._blocking(held.clear)

    async def _checked_info(self, info: Session, directory: str | None) -> Session:
        """``info`` as it will be created: checked as a create is, its script dropped."""
        ids.validate("ses", info.id, field="info.id")
        _check_usage("info", info.cost, info.tokens)
        _check_json(codec.to_json(info), "info")
        if await self._store.queries.session(info.id) is not None:
            raise ConflictError(f"session {info.id} already exists", resource="session")
        where = directory or info.location.directory
        await self._blocking(self._directories.check, where)
        await self._sessions.check_selection(where, info.agent, info.model, prefix="info.")
        parent = info.parent_id
        if parent is not None:
            ids.validate("ses", parent, field="info.parentID")
            if await self._store.queries.session(parent) is not None:
                # A document cannot make itself the child of a session here: it
                # would list among that session's children. Import it as a root.
                raise InvalidRequestError(
                    f"parentID {parent} names a session of this server, which the document"
                    " cannot attach itself to; import it without parentID",
                    field="info.parentID",
                )
            parent = None  # the document's parent is not here: the import is a root
        metadata = info.metadata
        if metadata is not None and "script" in metadata and not self._allow_scripts:
            # A script makes the scripted model run its directives (tool calls):
            # importing someone's export must not run their code.
            metadata = {k: v for k, v in metadata.items() if k != "script"}
        return attrs.evolve(
            info,
            parent_id=parent,
            location=attrs.evolve(info.location, directory=where),
            metadata=metadata,
        )

    async def _record(self, info: Session, held: builtins.list[Any]) -> Session:
        """Append the import; ``held`` starts with its message events and keeps what
        the appends make of them (the commands, the records) for the caller to free.

        Up to ``chunk_events`` events make one command, as they always did. A
        larger document goes in commands of that many events, one after the
        other, so other sessions' appends commit between them instead of
        waiting out one huge transaction (200,000 messages held the SQLite
        writer for seconds). Readers still see it whole or not at all: the
        first command's ``session.import.started`` makes the session hidden
        (not read, listed or counted) and the last one's
        ``session.import.finished`` shows it. Each command expects the seq
        the previous one left, so nothing else writes the session between
        them, and takes the session's lease (renewing it), so a sweep on
        another host leaves it alone while it goes on. A failed or cancelled
        import deletes what it wrote; one whose process died is deleted by
        the recovery sweep (:meth:`discard_abandoned`).
        """
        imported: builtins.list[ev.Event] = held[0]

        def created(kind: type[ev.SessionCreated]) -> ev.SessionCreated:
            return kind(
                session_id=info.id,
                parent_id=info.parent_id,
                title=info.title,
                agent=info.agent,
                model=info.model,
                location=info.location,
                metadata=info.metadata,
            )

        usage: builtins.list[ev.Event] = []
        t = info.tokens
        if info.cost or t != Tokens():
            # The session's totals as the document states them: they include
            # usage no message carries (a failed step's, a compaction's).
            tokens = ev.StepTokens(
                input=t.input,
                output=t.output,
                reasoning=t.reasoning,
                cache_read=t.cache.read,
                cache_write=t.cache.write,
            )
            usage.append(
                ev.UsageRecorded(session_id=info.id, source="import", cost=info.cost, tokens=tokens)
            )
        size = self._chunk_events
        if len(imported) + len(usage) < size:
            events = [created(ev.SessionCreated), *imported, *usage]
            await self._append_chunk(info.id, events, 0, None, held)
            return await self._sessions.get(info.id)
        chunks = [
            [created(ev.ImportStarted), *imported[: size - 1]],
            *(imported[i : i + size] for i in range(size - 1, len(imported), size)),
        ]
        chunks[-1] = [*chunks[-1], *usage, ev.ImportFinished(session_id=info.id)]
        self._importing.add(info.id)
        written = 0
        try:
            for n, chunk in enumerate(chunks):
                last = n == len(chunks) - 1
                # The last command lets the lease go (taken for no time).
                lease = self._lease(info.id, 0 if last else None)
                await self._append_chunk(info.id, chunk, written, lease, held)
                written += len(chunk)
        except BaseException:
            if written:
                # Shielded: a cancelled import still takes back what it wrote.
                # If it cannot now, the recovery sweep does.
                try:
                    await asyncio.shield(self._discard(info.id, None))
                except Exception as exc:
                    log.warning("the unfinished import of %s stays for the sweep: %s", info.id, exc)
            raise
        finally:
            self._importing.discard(info.id)
        return await self._sessions.get(info.id)

    async def _append_chunk(
        self,
        session_id: str,
        events: builtins.list[ev.Event],
        written: int,
        lease: LeaseUse | None,
        held: builtins.list[Any],
    ) -> None:
        try:
            # Made on a thread: for 200,000 messages it is a second of Python.
            command = await self._blocking(
                functools.partial(Command.of, expected={session_id: written}, lease=lease),
                *events,
            )
            held.append(command)

            async def append(_: Writer) -> None:
                held.append(await self._store.append(command))

            await self._owners.command(session_id, append)
        except (AppendConflictError, LeaseHeldError) as exc:
            raise ConflictError(
                f"session {session_id} cannot be imported: {exc}", resource="session"
            ) from None

    def _lease(self, session_id: str, ttl_ms: int | None) -> LeaseUse | None:
        if self._leases is None:
            return None
        if ttl_ms is None:
            return self._leases.take(session_id)
        return LeaseUse.take(session_id, self._leases.host_id, ttl_ms)

    async def _discard(self, session_id: str, seq: int | None) -> bool:
        """Delete the hidden session of an import that stopped at ``seq`` (None: this
        process's own import, wherever it stopped); whether it did."""
        command = Command.of(
            ev.SessionDeleted(session_id=session_id),
            expected=None if seq is None else {session_id: seq},
            lease=self._lease(session_id, 0),
        )

        async def discard(_: Writer) -> None:
            await self._store.append(command)

        try:
            await self._owners.command(session_id, discard)
        except (AppendConflictError, LeaseHeldError):
            return False  # it moved on, or another host holds it: not abandoned
        return True

    async def discard_abandoned(self) -> builtins.list[str]:
        """Delete the imports a process left unfinished (it died between their commands);
        the sessions deleted. One another host is still writing (its lease live), or
        this process is, stays."""
        found = await self._store.queries.imports()
        if not found:
            return []
        now = now_ms() if self._leases is None else self._leases.clock.now_ms()
        live = {lease.session_id for lease in await self._store.queries.leases(live_at=now)}
        gone = []
        for session_id, seq in found:
            if session_id in self._importing or session_id in live:
                continue
            if await self._discard(session_id, seq):
                log.warning("deleted the unfinished import of session %s", session_id)
                gone.append(session_id)
        return gone

    async def stats(self) -> SessionStats:
        sessions, forks = await self._store.queries.session_count()
        models: builtins.list[ModelUsage] = []
        for row in await self._store.queries.usage_by_model():
            model = None if row[0] is None else codec.from_json(ModelRef, codec.loads(row[0]))
            models.append(
                ModelUsage(
                    model=model,
                    sessions=int(row[1]),
                    messages=int(row[2]),
                    cost=float(row[3]),
                    tokens=_tokens(*(int(v) for v in row[4:9])),
                )
            )
        return SessionStats(
            sessions=sessions,
            forks=forks,
            cost=sum(m.cost for m in models),
            tokens=_tokens(
                sum(m.tokens.input for m in models),
                sum(m.tokens.output for m in models),
                sum(m.tokens.reasoning for m in models),
                sum(m.tokens.cache.read for m in models),
                sum(m.tokens.cache.write for m in models),
            ),
            models=tuple(models),
        )


#: The most an imported session or message may say it cost (US dollars).
_MAX_COST: Final = 1e9
#: SQLite stores 64-bit signed integers; anything wider is refused up front.
_INT_MIN: Final = -(2**63)
_INT_MAX: Final = 2**63 - 1


def _imported(session_id: str, messages: Sequence[SessionMessage]) -> builtins.list[ev.Event]:
    """The import events of ``messages``, each checked (blocking: a thread's work)."""
    for index, message in enumerate(messages):
        _check_message(message, f"messages[{index}]")
    return [_import_event(session_id, m) for m in messages]


def _imported_json(session_id: str, raw: builtins.list[Any]) -> builtins.list[ev.Event]:
    """:func:`_imported` of messages still in JSON: all decoded and checked first."""
    messages: builtins.list[SessionMessage] = []
    for index, item in enumerate(raw):
        raw[index] = None  # let each parsed message go once it is decoded
        where = f"messages[{index}]"
        message: SessionMessage = codec.from_json(
            SessionMessage,  # type: ignore[arg-type]
            item,
            path=where,
            strict=True,
        )
        _check_message(message, where)
        messages.append(message)
    return [_import_event(session_id, m) for m in messages]


def _import_event(session_id: str, message: SessionMessage) -> ev.Event:
    # Fresh ids: a copy imported next to its original must not collide with it.
    fresh = attrs.evolve(message, id=ids.message_id())
    return ev.MessageImported(session_id=session_id, message=_message_json(fresh))


def _check_message(message: SessionMessage, where: str) -> None:
    """Refuse, as a 400, what could not be stored as it is (nothing is written then)."""
    if isinstance(message, SystemMessage):
        raise InvalidRequestError("system messages are derived and cannot be imported", field=where)
    if isinstance(message, AssistantMessage):
        keys = [_part_key(p) for p in message.parts]
        if len(set(keys)) != len(keys):
            raise InvalidRequestError(
                f"message {message.id} has two parts with the same ordinal or tool id",
                field=where,
            )
        _check_usage(where, message.cost, message.tokens)
    _check_json(codec.to_json(message), where)


def _check_usage(where: str, cost: float | None, tokens: Tokens | None) -> None:
    if cost is not None and not (math.isfinite(cost) and 0 <= cost <= _MAX_COST):
        raise InvalidRequestError(
            f"cost must be a number from 0 to {_MAX_COST:g}", field=f"{where}.cost"
        )
    if tokens is not None:
        counts = (
            tokens.input,
            tokens.output,
            tokens.reasoning,
            tokens.cache.read,
            tokens.cache.write,
        )
        if any(n < 0 for n in counts):
            raise InvalidRequestError("token counts must not be negative", field=f"{where}.tokens")


def _part_key(part: TextPart | ReasoningPart | ToolPart) -> str:
    return f"tool:{part.id}" if isinstance(part, ToolPart) else f"{part.type}:{part.ordinal}"


def _check_json(value: Any, where: str = "info") -> None:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, bool):
            continue
        if isinstance(item, int):
            if not _INT_MIN <= item <= _INT_MAX:
                raise InvalidRequestError("a number is out of the 64-bit range", field=where)
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise InvalidRequestError("a number is not finite", field=where)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _tokens(input: int, output: int, reasoning: int, read: int, write: int) -> Tokens:
    return Tokens(
        input=input, output=output, reasoning=reasoning, cache=CacheTokens(read=read, write=write)
    )


def _message_json(message: SessionMessage) -> dict[str, Any]:
    data: dict[str, Any] = codec.to_json(message)
    data.pop("sessionID", None)
    data.pop("seq", None)
    return data


def sanitized(message: SessionMessage) -> SessionMessage:
    """``message`` without file contents and tool outputs."""
    if isinstance(message, UserMessage) and message.files:
        return attrs.evolve(message, files=tuple(attrs.evolve(f, data="") for f in message.files))
    if isinstance(message, AssistantMessage):
        parts = tuple(
            attrs.evolve(p, content=None, metadata=None) if isinstance(p, ToolPart) else p
            for p in message.parts
        )
        return attrs.evolve(message, parts=parts)
    return message
