"""The in-process session facade: every session operation, keyed by id.

This is what the HTTP server and an embedding program call. It owns the
admission policy (through :class:`~actors.session.inbox.Inbox`), the session
lifecycle events and the projection reads; it does not run anything itself:
scheduling is the ``wake`` hook's job (the execution supervisor provides it).

Errors are the public tagged errors of :mod:`protocol.errors`; storage
conflicts are translated here.
"""

from __future__ import annotations

import asyncio
import builtins
import datetime
import functools
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, Protocol

import attrs
import orjson

from actors.agents import AgentCatalogs
from actors.attachments import Withheld
from actors.files.locations import DirectoryRules
from actors.permissions import PermissionWaiters
from actors.session.inbox import (
    Blocking,
    Doorbell,
    Inbox,
    Owners,
    RevertCommits,
    Run,
    Scope,
    Writer,
    append_session_events,
)
from actors.supervisor import Standalone
from protocol import events as ev
from protocol import ids
from protocol.cursor import (
    MessageAnchor,
    MessageCursor,
    SessionCursor,
    SessionQuery,
    decode_cursor,
)
from protocol.errors import (
    ConflictError,
    InvalidCursorError,
    InvalidRequestError,
    MessageNotFoundError,
    PermissionNotFoundError,
    SessionNotFoundError,
)
from protocol.requests import (
    CreateSessionInput,
    PromptInput,
    SyntheticInput,
    UpdateSessionInput,
)
from protocol.shapes import (
    Delivery,
    ForkBoundary,
    InboxItem,
    Location,
    ModelRef,
    Order,
    Page,
    Session,
    SessionMessage,
)
from storage import AppendConflictError, Command, EntryWrite, ProjectionConflict, Store

__all__ = ["MAX_CHILDREN", "MAX_PAGE", "NOTHING_RUNS", "Sessions", "Stops"]


class Stops(Protocol):
    """Who ends the local execution of sessions being deleted (the runtime's execution)."""

    async def stop_sessions(self, session_ids: Sequence[str]) -> None:
        """Stop them (tools killed); return once none of them runs here any more."""
        ...


MAX_PAGE: Final = 200
DEFAULT_PAGE: Final = 50
#: The most children ``GET /api/session/{id}/children`` lists (oldest first).
MAX_CHILDREN: Final = 1000


class _NothingRuns:
    """The doorbell and stops of a facade that records input but runs nothing."""

    def wake(self, session_id: str, scope: Scope) -> None:
        pass

    async def stop_sessions(self, session_ids: Sequence[str]) -> None:
        pass


NOTHING_RUNS: Final = _NothingRuns()


class Sessions:
    def __init__(
        self,
        store: Store,
        *,
        wake: Doorbell = NOTHING_RUNS,
        stop: Stops = NOTHING_RUNS,
        owners: Owners | None = None,
        revert: RevertCommits | None = None,
        default_directory: str | None = None,
        blocking: Blocking = asyncio.to_thread,
        directories: DirectoryRules | None = None,
        check_model: Callable[[ModelRef], None] | None = None,
        agents: AgentCatalogs | None = None,
        waiters: PermissionWaiters | None = None,
    ) -> None:
        self._store = store
        #: The tool calls of this process waiting for a permission reply.
        self._waiters = PermissionWaiters() if waiters is None else waiters
        self._stop = stop.stop_sessions
        #: The session actors every write to a session goes through (a facade
        #: without a runtime starts its own, which only serialise).
        self._standalone: Standalone | None = None
        if owners is None:
            owners = self._standalone = Standalone()
        self._owners = self.owners = owners
        self._blocking = blocking
        self._directories = directories or DirectoryRules()
        data_dir = self._directories.data_dir
        withheld = Withheld(
            directories=() if data_dir is None else (data_dir,),
            files=() if store.path is None else (Path(store.path),),
        )
        self.inbox = Inbox(store, wake, self._owners, blocking, withheld, revert)
        self._default_directory = default_directory or os.getcwd()
        #: Raises InvalidRequestError for a model no provider serves (the
        #: runtime passes its registry's check); None accepts any model.
        self._check_model = check_model
        #: The agents each Location knows; an agent name outside them is a 400
        #: (field ``agent``). None accepts any name (a runtime that runs nothing).
        self._agents = agents

    async def aclose(self) -> None:
        """Stop the session actors this facade started itself (none with a runtime's)."""
        if self._standalone is not None:
            await self._standalone.aclose()

    # -- lifecycle ------------------------------------------------------------------------------

    async def create(self, request: CreateSessionInput | None = None) -> Session:
        """Create a session; reusing an existing id adopts that session."""
        request = request or CreateSessionInput()
        if request.model is not None and self._check_model is not None:
            self._check_model(request.model)
        session_id = request.id or ids.session_id()
        if request.id is not None:
            existing = await self._store.queries.session(session_id)
            if existing is not None:
                return existing
        if request.parent_id is not None and not await self._exists(request.parent_id):
            raise SessionNotFoundError(request.parent_id)
        directory = (request.location or Location(directory=self._default_directory)).directory
        await self._blocking(self._directories.check, directory)
        if request.agent is not None:
            await self._check_agent(directory, request.agent)
        event = ev.SessionCreated(
            session_id=session_id,
            parent_id=request.parent_id,
            title=request.title or _default_title(),
            agent=request.agent,
            model=request.model,
            location=Location(directory=directory),
            metadata=request.metadata,
        )

        async def create(_: Writer) -> None:
            await self._store.append(Command.of(event, expected={session_id: 0}))

        try:
            await self._owners.command(session_id, create)
        except AppendConflictError:
            # A concurrent create of the same id won: adopt it. If no session
            # is projected the id belonged to a deleted session and is spent.
            adopted = await self._store.queries.session(session_id)
            if adopted is None:
                raise ConflictError(
                    f"session id {session_id} was used by a deleted session", resource="session"
                ) from None
            return adopted
        return await self.get(session_id)

    async def get(self, session_id: str) -> Session:
        ids.validate("ses", session_id, field="sessionID")
        session = await self._store.queries.session(session_id)
        if session is None:
            raise SessionNotFoundError(session_id)
        return session

    async def list(
        self, query: SessionQuery | None = None, *, cursor: str | None = None
    ) -> Page[Session]:
        """A page of sessions: a fresh ``query``, or a ``cursor`` from a previous page."""
        if cursor is not None:
            if query is not None:
                raise InvalidRequestError("a continuation takes only the cursor", field="cursor")
            decoded = decode_cursor(SessionCursor, cursor)
            _check_limit(decoded.query.limit, cursor=True)
            return await self._store.queries.sessions(decoded.query, decoded.anchor)
        query = query or SessionQuery()
        _check_limit(query.limit)
        if query.parent_id is not None:
            ids.validate("ses", query.parent_id, field="parentID")
        return await self._store.queries.sessions(query, None)

    async def children(self, session_id: str) -> builtins.list[Session]:
        """The session's child sessions (subagents' and forks'), oldest first,
        at most :data:`MAX_CHILDREN`."""
        await self.get(session_id)
        return await self._store.queries.child_sessions(session_id, MAX_CHILDREN)

    async def update(self, session_id: str, request: UpdateSessionInput) -> None:
        await self.get(session_id)
        events: builtins.list[ev.Event] = []
        if request.title is not None:
            events.append(ev.SessionRenamed(session_id=session_id, title=request.title))
        if request.metadata is not None:
            events.append(ev.MetadataUpdated(session_id=session_id, metadata=request.metadata))
        await self._apply(session_id, *events)

    async def remove(self, session_id: str) -> None:
        """Delete a session and all its descendants in one transaction.

        Their executions are interrupted first, and their tools' processes
        killed: nothing keeps running for a session that no longer exists.
        The deletion is a command of every one of their actors at once: it is
        written while each of them runs it (so a command of a child, an
        admission say, lands wholly before it or is refused after it), the
        children's deletions first, as one transaction.
        """
        await self.get(session_id)
        doomed: builtins.list[str] = []
        frontier = [session_id]
        while frontier:
            current = frontier.pop()
            doomed.append(current)
            frontier.extend(await self._store.queries.children(current))
        await self._stop(doomed)

        async def delete(_: Writer) -> None:
            # Read with every doomed actor inside this command: a descendant
            # another deletion took meanwhile is not deleted twice.
            alive = [s for s in reversed(doomed) if await self._exists(s)]
            if session_id not in alive:
                raise SessionNotFoundError(session_id)
            await self._append(session_id, *(ev.SessionDeleted(session_id=s) for s in alive))

        await self._command_of_all(doomed, delete)

    async def _command_of_all(self, session_ids: Sequence[str], run: Run) -> Any:
        """Run ``run`` as a command of every one of ``session_ids``' actors at once.

        Each actor in turn runs a command that waits for the next one's, and
        the last runs ``run``: while it runs, none of them runs anything else.
        They are taken in the order given, ancestors before descendants, so
        two deletions of nested trees cannot wait on each other (the smaller
        tree's root is the first of its sessions either takes). No command
        awaits anything of its own actor's, so the chain always unwinds.
        """
        first, rest = session_ids[0], session_ids[1:]
        if not rest:
            return await self._owners.command(first, run)
        return await self._owners.command(first, lambda _: self._command_of_all(rest, run))

    async def switch_agent(self, session_id: str, agent: str) -> None:
        """Select ``agent``; a running step keeps its agent, the next one uses this."""
        if not agent:
            raise InvalidRequestError("agent must not be empty", field="agent")
        session = await self.get(session_id)
        await self._check_agent(session.location.directory, agent)

        async def switch(_: Writer) -> None:
            # Compared in the command: ``previous`` is what the last switch left.
            current = await self.get(session_id)
            if current.agent != agent:
                selected = ev.AgentSelected(
                    session_id=session_id, agent=agent, previous=current.agent
                )
                await self._append(session_id, selected)

        await self._owners.command(session_id, switch)

    async def switch_model(self, session_id: str, model: ModelRef) -> None:
        """Select ``model`` from the next step on; an unknown one is a 400 here."""
        if self._check_model is not None:
            self._check_model(model)
        ids.validate("ses", session_id, field="sessionID")

        async def switch(_: Writer) -> None:
            # Compared in the command: ``previous`` is what the last switch left.
            current = await self.get(session_id)
            if current.model != model:
                selected = ev.ModelSelected(
                    session_id=session_id, model=model, previous=current.model
                )
                await self._append(session_id, selected)

        await self._owners.command(session_id, switch)

    # -- structure ------------------------------------------------------------------------------

    async def fork(self, session_id: str, before: str | None = None) -> Session:
        """A new independent session holding ``session_id``'s settled transcript.

        ``before`` (a message of the parent) copies the messages before it;
        absent, everything projected now. A running parent may go on: its
        unsettled step stays its own, and nothing either does later touches
        the other. The child starts from the parent's newest instruction
        values (no initial re-admission of what is unchanged) and a copy of
        its live instruction entries.
        """
        parent = await self.get(session_id)
        if before is not None:
            ids.validate("msg", before, field="before")
            if await self._store.queries.message(session_id, before) is None:
                raise MessageNotFoundError(session_id, before)
            boundary = ForkBoundary(type="before", message_id=before)
        else:
            newest = await self._store.queries.newest_message(session_id)
            boundary = ForkBoundary(type="through", message_id=newest)
        child = ids.session_id()
        # The parent's newest instruction values become the child's baseline
        # (projected from the event); its live API entries are primary state,
        # so the copy is written with the command, not derived on replay.
        state, entries = await self._store.queries.instruction_inputs(session_id)
        forked = ev.SessionForked(
            session_id=child,
            parent_id=session_id,
            boundary=boundary,
            instructions=None if state is None else dict(state.current),
            instruction_entries=tuple({"key": k, "value": orjson.loads(v)} for k, v in entries)
            or None,
        )
        title = ev.SessionRenamed(session_id=child, title=_fork_title(parent.title))
        command = attrs.evolve(
            Command.of(forked, title, expected={child: 0}),
            entries=tuple(EntryWrite(session_id=child, key=k, value=v) for k, v in entries),
        )

        async def fork(_: Writer) -> None:
            await self._store.append(command)

        try:
            await self._owners.command(child, fork)  # the new session's first event
        except ProjectionConflict as exc:
            if exc.reason == "fork.source-missing":
                # The parent (or the boundary message) went between the read and the append.
                if before is not None and await self._exists(session_id):
                    raise MessageNotFoundError(session_id, before) from None
                raise SessionNotFoundError(session_id) from None
            raise ConflictError(str(exc), resource="session") from None
        return await self.get(child)

    async def view(self, session_id: str, idle: int) -> None:
        """Mark the idle transition ``idle`` as seen (a monotone watermark)."""
        if idle < 0:
            raise InvalidRequestError("idle must be a non-negative epoch ms", field="idle")
        await self.get(session_id)
        await self._apply(session_id, ev.SessionViewed(session_id=session_id, idle=idle))

    # -- input ----------------------------------------------------------------------------------

    async def prompt(self, session_id: str, request: PromptInput) -> InboxItem:
        return await self.inbox.prompt(session_id, request)

    async def synthetic(self, session_id: str, request: SyntheticInput) -> InboxItem:
        return await self.inbox.synthetic(session_id, request)

    async def pending(self, session_id: str) -> builtins.list[InboxItem]:
        return await self.inbox.pending(session_id)

    async def cancel(self, session_id: str, inbox_id: str) -> None:
        await self.inbox.cancel(session_id, inbox_id)

    async def change_delivery(self, session_id: str, inbox_id: str, delivery: Delivery) -> None:
        await self.inbox.change_delivery(session_id, inbox_id, delivery)

    async def compact(
        self, session_id: str, item_id: str | None = None, delivery: Delivery = "steer"
    ) -> InboxItem:
        """Request a manual compaction: a control item in the inbox (one pending at most)."""
        await self.get(session_id)
        return await self.inbox.compact(session_id, item_id, delivery)

    async def move(
        self, session_id: str, directory: str, delivery: Delivery = "steer"
    ) -> InboxItem:
        """Request a move to ``directory``: a control item in the inbox (one pending at most).

        The directory is checked here, at admission (it exists, is a
        directory, is not the data directory): a refusal is a 400 and admits
        nothing. Delivery (``session.moved``) changes the Location at a Safe
        Step Boundary; the steps after it run there.
        """
        await self.get(session_id)
        await self._blocking(
            functools.partial(self._directories.check, directory, field="directory")
        )
        return await self.inbox.move(session_id, Location(directory=directory), delivery)

    async def promote(self, session_id: str, scope: Scope) -> int:
        """Deliver what a boundary at ``scope`` delivers, as a drain would (its actor runs it)."""
        promotion = await self._owners.command(
            session_id,
            functools.partial(self.inbox.promote, session_id, scope, ()),
            keeps_inbox=True,
        )
        return len(promotion.delivered)

    # -- permissions ----------------------------------------------------------------------------

    async def permissions(self, session_id: str) -> builtins.list[ev.PermissionAsked]:
        """The session's unanswered permission requests, oldest first."""
        await self.get(session_id)
        return await self._store.queries.permission_requests(session_id)

    async def reply_permission(
        self, session_id: str, permission_id: str, reply: ev.PermissionReply
    ) -> None:
        """Answer one request: durable first, then the waiting call (if it waits here) wakes.

        ``always`` also allows the request's ``always`` patterns for the rest
        of the session. A request this session never made is a 404; one
        already answered, or whose call settled unanswered, a 409.
        """
        if reply not in ("once", "always", "reject"):
            raise InvalidRequestError("reply must be once, always or reject", field="reply")
        await self.get(session_id)
        if not ids.is_valid("per", permission_id):
            raise PermissionNotFoundError(session_id, permission_id)

        async def answer(_: Writer) -> None:
            status = await self._store.queries.permission_status(session_id, permission_id)
            if status is None:
                raise PermissionNotFoundError(session_id, permission_id)
            if status != "pending":
                raise _answered(permission_id, status)
            try:
                await self._store.append(
                    Command.of(
                        ev.PermissionReplied(session_id=session_id, id=permission_id, reply=reply)
                    )
                )
            except ProjectionConflict as exc:
                if exc.reason == "session.missing":
                    raise SessionNotFoundError(session_id) from None
                # The call settled (or another reply won) between the read and the write.
                raise _answered(permission_id, "answered") from None

        await self._owners.command(session_id, answer)
        self._waiters.resolve(permission_id, reply)

    # -- transcript -----------------------------------------------------------------------------

    async def messages(
        self,
        session_id: str,
        *,
        order: Order | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Page[SessionMessage]:
        await self.get(session_id)
        anchor: MessageAnchor | None = None
        if cursor is not None:
            if order is not None or limit is not None:
                raise InvalidRequestError("a continuation takes only the cursor", field="cursor")
            decoded = decode_cursor(MessageCursor, cursor)
            if decoded.session_id != session_id:
                raise InvalidCursorError("cursor belongs to another session")
            _check_limit(decoded.limit, cursor=True)
            order, limit, anchor = decoded.order, decoded.limit, decoded.anchor
        limit = DEFAULT_PAGE if limit is None else limit
        _check_limit(limit)
        return await self._store.queries.messages(session_id, order or "desc", limit, anchor)

    async def message(self, session_id: str, message_id: str) -> SessionMessage:
        await self.get(session_id)
        ids.validate("msg", message_id, field="messageID")
        message = await self._store.queries.message(session_id, message_id)
        if message is None:
            # Never say whether the id exists in some other session.
            raise MessageNotFoundError(session_id, message_id)
        return message

    async def context(self, session_id: str) -> builtins.list[SessionMessage]:
        """The model-visible history: the last completed compaction and what follows it."""
        await self.get(session_id)
        return await self._store.queries.context(session_id)

    async def check_selection(
        self, directory: str, agent: str | None, model: ModelRef | None, *, prefix: str = ""
    ) -> None:
        """Refuse what a create refuses: an agent ``directory`` does not know, a model
        no provider here serves (400 naming ``<prefix>agent`` or ``<prefix>model``)."""
        try:
            if model is not None and self._check_model is not None:
                self._check_model(model)
            if agent is not None:
                await self._check_agent(directory, agent)
        except InvalidRequestError as exc:
            field = exc.fields.get("field")
            if not prefix or field is None:
                raise
            raise InvalidRequestError(
                exc.message, kind=exc.fields.get("kind"), field=f"{prefix}{field}"
            ) from None

    # -- helpers --------------------------------------------------------------------------------

    async def _check_agent(self, directory: str, agent: str) -> None:
        """Raises InvalidRequestError (field ``agent``) for a name ``directory`` does not know."""
        if self._agents is not None:
            await self._agents.agent(directory, agent)

    async def _exists(self, session_id: str) -> bool:
        return await self._store.queries.session(session_id) is not None

    async def _apply(self, session_id: str, *events: ev.Event) -> None:
        """Append ``events`` of ``session_id`` as a command of its actor."""
        if not events:
            return
        await self._owners.command(session_id, lambda _: self._append(session_id, *events))

    async def _append(self, session_id: str, *events: ev.Event) -> None:
        """Append ``events`` of ``session_id`` (in a command of its actor)."""
        await append_session_events(self._store, session_id, *events)


def _answered(permission_id: str, status: str) -> ConflictError:
    how = "expired with its tool call" if status == "expired" else f"already answered ({status})"
    return ConflictError(f"permission request {permission_id} {how}", resource="permission")


def _check_limit(limit: Any, *, cursor: bool = False) -> None:
    if not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        if cursor:
            raise InvalidCursorError()
        raise InvalidRequestError(f"limit must be between 1 and {MAX_PAGE}", field="limit")


_FORK_TITLE: Final = re.compile(r"^(.*) \(fork #(\d+)\)$", re.DOTALL)


def _fork_title(title: str) -> str:
    """``T`` -> ``T (fork #1)``; ``T (fork #n)`` -> ``T (fork #n+1)``."""
    match = _FORK_TITLE.match(title)
    if match is not None:
        return f"{match.group(1)} (fork #{int(match.group(2)) + 1})"
    return f"{title} (fork #1)"


def _default_title() -> str:
    now = datetime.datetime.now(datetime.UTC)
    return "New session - " + now.isoformat(timespec="milliseconds").replace("+00:00", "Z")
