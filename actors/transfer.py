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

import builtins
import math
from typing import Any, Final

import attrs

from actors.inbox import Blocking
from actors.locations import DirectoryRules
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
from storage import AppendConflictError, Command, Store

__all__ = ["SessionTransfer", "sanitized"]


class SessionTransfer:
    def __init__(
        self,
        store: Store,
        sessions: Sessions,
        *,
        directories: DirectoryRules,
        blocking: Blocking,
    ) -> None:
        self._store = store
        self._sessions = sessions
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
        info = document.info
        ids.validate("ses", info.id, field="info.id")
        _check_document(document)
        if await self._store.queries.session(info.id) is not None:
            raise ConflictError(f"session {info.id} already exists", resource="session")
        where = directory or info.location.directory
        await self._blocking(self._directories.check, where)
        parent = info.parent_id
        if parent is not None and await self._store.queries.session(parent) is None:
            parent = None  # the document's parent is not here: the import is a root
        created = ev.SessionCreated(
            session_id=info.id,
            parent_id=parent,
            title=info.title,
            agent=info.agent,
            model=info.model,
            location=attrs.evolve(info.location, directory=where),
            metadata=info.metadata,
        )
        imported = [
            ev.MessageImported(
                session_id=info.id, message=_message_json(attrs.evolve(m, id=ids.message_id()))
            )
            for m in document.messages
        ]
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
        try:
            await self._store.append(Command.of(created, *imported, *usage, expected={info.id: 0}))
        except AppendConflictError as exc:
            raise ConflictError(
                f"session {info.id} cannot be imported: {exc}", resource="session"
            ) from None
        return await self._sessions.get(info.id)

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


#: SQLite stores 64-bit signed integers; anything wider is refused up front.
_INT_MIN: Final = -(2**63)
_INT_MAX: Final = 2**63 - 1


def _check_document(document: SessionExport) -> None:
    """Refuse, as a 400, what could not be stored as it is (nothing is written then)."""
    for message in document.messages:
        if isinstance(message, SystemMessage):
            raise InvalidRequestError(
                "system messages are derived and cannot be imported", field="messages"
            )
        if isinstance(message, AssistantMessage):
            keys = [_part_key(p) for p in message.parts]
            if len(set(keys)) != len(keys):
                raise InvalidRequestError(
                    f"message {message.id} has two parts with the same ordinal or tool id",
                    field="messages",
                )
    _check_json(codec.to_json(document))


def _part_key(part: TextPart | ReasoningPart | ToolPart) -> str:
    return f"tool:{part.id}" if isinstance(part, ToolPart) else f"{part.type}:{part.ordinal}"


def _check_json(value: Any) -> None:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, bool):
            continue
        if isinstance(item, int):
            if not _INT_MIN <= item <= _INT_MAX:
                raise InvalidRequestError("a number is out of the 64-bit range", field="info")
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise InvalidRequestError("a number is not finite", field="info")
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
