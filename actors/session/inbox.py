"""The inbox: admission, pending-input changes and promotion of a session's input.

Admission is durable before anything runs: ``prompt``/``synthetic`` publish
one ``session.inbox.enqueued`` and only then (``resume``) ring the wake hook.
Every mutation of a session's inbox (admission, delivery, cancellation,
delivery change) is a command its session actor runs (:class:`Owners`), one
at a time, so retries and promotions see each other's effects in order; the
projectors enforce the same rules again inside the transaction (a second
cancel or delivery deletes nothing and fails). The drain asks its actor for
each boundary's read and promotion (:meth:`Inbox.boundary`,
:meth:`Inbox.promote`), which therefore know whether anything changed the
inbox since (:attr:`Writer.inbox`).

Id reconciliation comes first, before any preparation (attachment reading):
an id already admitted in the same session with the same type returns the
first admission's receipt, whatever the retry carries; pending or delivered
makes no difference (a delivered item's receipt is rebuilt from its message).
An id used in another session or with another type is a conflict. A cancelled
id is free again.

Control items (manual compaction, move) share one admission: at most one of
each type is pending per session (checked by the session actor); a second request gets
the pending one back (a move only when it goes to the same Location, else a
conflict), and an id already delivered is a conflict.

Promotion order (``promote``): every pending steer in enqueue order, stopping
before a control item (compaction, move); at the idle boundary (scope
``input``) with no steer pending, exactly one queued item.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal, Protocol

import attrs

from actors.attachments import Blocking, Withheld, materialise
from protocol import events as ev
from protocol import ids
from protocol.errors import ConflictError, ServiceUnavailableError, SessionNotFoundError
from protocol.requests import PromptInput, SyntheticInput
from protocol.shapes import Delivery, InboxItem, InboxItemType, Location, Session
from storage import Boundary, Command, DrainStart, Op, ProjectionConflict, Store, no_staged_revert

__all__ = [
    "CONTROL_TYPES",
    "NOTHING_DUE",
    "AdmissionGate",
    "Blocking",
    "Doorbell",
    "Due",
    "Inbox",
    "Owners",
    "Promotion",
    "RevertCommits",
    "Run",
    "Scope",
    "Writer",
    "append_session_events",
    "control_head",
    "due",
    "select_promotable",
]

#: ``input``: the idle/entry boundary (queued input may deliver); ``steer``: a
#: step boundary inside a running drain (only steers deliver).
Scope = Literal["input", "steer"]
RevertCommit = Callable[[Session], Awaitable[list[ev.Event]]]


class Doorbell(Protocol):
    """Who runs a session when input arrives (the runtime's execution)."""

    def wake(self, session_id: str, scope: Scope) -> None: ...


class Writer(Protocol):
    """What a command sees of its session actor while it runs (alone)."""

    @property
    def busy(self) -> bool:
        """Whether the session has a busy period on this host."""
        ...

    #: The session's pending input as the actor's last read or promotion left
    #: it; None when unknown (any other command ran since: read it).
    inbox: list[InboxItem] | None


#: A command's work, run by the session's actor as the session's only writer.
Run = Callable[[Writer], Awaitable[Any]]


class Owners(Protocol):
    """Who runs a session's commands: its session actor, the only writer of its session."""

    async def command(self, session_id: str, run: Run, *, keeps_inbox: bool = False) -> Any:
        """Run ``run`` in the session's actor, between two other messages; its result."""
        ...


async def append_session_events(store: Store, session_id: str, *events: ev.Event) -> None:
    """Append ``events`` of ``session_id`` (in a command of its actor): the session
    gone is a 404, any other projection conflict a 409 on the session."""
    try:
        await store.append(Command.of(*events))
    except ProjectionConflict as exc:
        if exc.reason == "session.missing":
            raise SessionNotFoundError(session_id) from None
        raise ConflictError(str(exc), resource="session") from None


class RevertCommits(Protocol):
    """The events committing a session's staged revert (the runtime's reverts)."""

    async def commit_events(self, session: Session) -> list[ev.Event]: ...


CONTROL_TYPES: Final[frozenset[str]] = frozenset({"compaction", "move"})


@attrs.frozen
class Promotion:
    """What a promotion delivered, and the pending input it left behind (what
    the session actor knows of its inbox until its next other command)."""

    delivered: list[InboxItem]
    left: list[InboxItem]


class AdmissionGate:
    """Lets a closing host finish the admissions under way, then refuses new ones.

    An admission holds the gate from its first check to its wake; after
    :meth:`close` returns, every admission that got in has rung its wake (so
    the host can hand the wakes it refused over to the others) and any later
    one fails with 503 before it writes.
    """

    def __init__(self) -> None:
        self._open = True
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def admitting(self) -> AdmissionGate:
        """``with gate.admitting():`` around an admission (the gate is its own
        context manager: a generator-based one cost more than the counting)."""
        return self

    def __enter__(self) -> None:
        if not self._open:
            raise ServiceUnavailableError("this host is shutting down", service="execution")
        self._inflight += 1
        self._idle.clear()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._inflight -= 1
        if not self._inflight:
            self._idle.set()

    async def close(self) -> None:
        self._open = False
        await self._idle.wait()


class Inbox:
    def __init__(
        self,
        store: Store,
        wake: Doorbell,
        owners: Owners,
        blocking: Blocking = asyncio.to_thread,
        withheld: Withheld | None = None,
        revert: RevertCommits | None = None,
    ) -> None:
        self._store = store
        self._wake = wake.wake
        self._owners = owners
        self._blocking = blocking
        self._withheld = withheld or Withheld(
            files=() if store.path is None else (Path(store.path),)
        )
        #: The events committing a session's staged revert; a prompt's admission
        #: carries them in its own transaction.
        self.revert_commit: RevertCommit | None = None if revert is None else revert.commit_events
        #: Closed by a closing runtime before it hands its refused wakes over.
        self.gate = AdmissionGate()

    # -- admission ------------------------------------------------------------------------------

    async def prompt(self, session_id: str, request: PromptInput) -> InboxItem:
        files = request.files
        prepare: Callable[[], Awaitable[Mapping[str, Any]]] | Mapping[str, Any]
        if files is None:
            # Nothing to read first: the payload as it is (no coroutine to make).
            prepare = _compact({"text": request.text, "metadata": request.metadata})
        else:

            async def read_files() -> dict[str, Any]:
                materialised = await materialise(
                    files,
                    self._blocking,
                    directory=await self._directory(session_id),
                    withheld=self._withheld,
                )
                return _compact(
                    {"text": request.text, "files": materialised, "metadata": request.metadata}
                )

            prepare = read_files
        return await self._admit(
            session_id, "user", request.id, request.delivery, request.resume, prepare
        )

    async def synthetic(self, session_id: str, request: SyntheticInput) -> InboxItem:
        async def payload() -> dict[str, Any]:
            return _compact(
                {
                    "text": request.text,
                    "description": request.description,
                    "metadata": request.metadata,
                }
            )

        return await self._admit(
            session_id, "synthetic", request.id, request.delivery, request.resume, payload
        )

    async def compact(
        self, session_id: str, item_id: str | None, delivery: Delivery, resume: bool = True
    ) -> InboxItem:
        """Admit a manual compaction: a control item with an empty payload.

        At most one is pending per session: a second request (any id) gets the
        pending one back. An id already delivered (its compaction ran or runs)
        is a conflict, like an id of another type or session.
        """
        return await self._admit_control(session_id, "compaction", item_id, delivery, {}, resume)

    async def move(
        self, session_id: str, location: Location, delivery: Delivery, resume: bool = True
    ) -> InboxItem:
        """Admit a move to ``location`` (already checked): a control item.

        At most one is pending per session: a second request to the same
        Location gets the pending one back; one to another Location is a
        conflict (cancel the pending move first), never a silent drop.
        """
        payload = {"location": {"directory": location.directory}}
        return await self._admit_control(
            session_id, "move", None, delivery, payload, resume, same=payload
        )

    async def _admit_control(
        self,
        session_id: str,
        type_: InboxItemType,
        item_id: str | None,
        delivery: Delivery,
        payload: Mapping[str, Any],
        resume: bool,
        *,
        same: Mapping[str, Any] | None = None,
    ) -> InboxItem:
        """One pending control item of ``type_`` per session (the session actor checks).

        A pending one is returned to a second request when ``same`` is None or
        equals its payload, and is a conflict otherwise.
        """
        ids.validate("ses", session_id, field="sessionID")
        if item_id is not None:
            ids.validate("msg", item_id, field="id")

        async def admit(_: Writer) -> InboxItem:
            pending = next(
                (i for i in await self._store.queries.inbox(session_id) if i.type == type_),
                None,
            )
            if pending is not None and same is not None and pending.payload != same:
                raise ConflictError(
                    f"{type_} {pending.id} is already pending; cancel it first",
                    resource="inbox",
                )
            if pending is None and item_id is not None:
                found = await self._reconcile(session_id, type_, item_id)
                if found is not None:
                    raise ConflictError(
                        f"{type_} {item_id} was already delivered", resource="message"
                    )
            return pending or await self._enqueue_in_actor(
                session_id, type_, item_id, delivery, payload
            )

        with self.gate.admitting():
            receipt: InboxItem = await self._owners.command(session_id, admit)
            if resume:
                self._wake(session_id, "input")
            return receipt

    async def control(
        self,
        session_id: str,
        item: InboxItem,
        also: Sequence[ev.Event],
        writer: Writer,
        *,
        scope: Scope,
        held: Collection[str] = (),
    ) -> bool:
        """Deliver control ``item`` with ``also`` in one command; False if it is not due.

        The drain asks its actor to run this when its boundary read found the
        item due (:func:`control_head`). Here, in the actor, it is due again
        by the same rule (:func:`due`) or nothing is delivered: a cancel that
        won the race leaves nothing to deliver, and a change of delivery that
        made older input a steer lets that steer deliver first (the drain's
        next boundary promotes it; the item is due after it).
        """
        pending = writer.inbox
        if pending is None:
            pending = await self._store.queries.inbox(session_id)
        head = due(pending, scope, held).control
        if head is None or head.id != item.id:
            return False
        await self._apply(ev.InboxDelivered(session_id=session_id, inbox_id=item.id), *also)
        return True

    async def _admit(
        self,
        session_id: str,
        type_: InboxItemType,
        item_id: str | None,
        delivery: Delivery,
        resume: bool,
        prepare: Callable[[], Awaitable[Mapping[str, Any]]] | Mapping[str, Any],
    ) -> InboxItem:
        """``prepare`` makes the payload (reading attachments), or is it."""
        ids.validate("ses", session_id, field="sessionID")
        with self.gate.admitting():
            receipt = None if item_id is None else await self._reconcile(session_id, type_, item_id)
            if receipt is None:
                # No existence check here: the enqueue's projection refuses an
                # unknown or deleted session in the same transaction (one read
                # fewer per admission); only attachment reading happens first.
                payload = prepare if isinstance(prepare, Mapping) else await prepare()
                receipt = await self._enqueue(session_id, type_, item_id, delivery, payload)
            if resume and type_ == "synthetic" and self.revert_commit is not None:
                # Held behind a staged revert: recorded, never woken for.
                session = await self._store.queries.session(session_id)
                resume = session is None or session.revert is None
            if resume:
                self._wake(session_id, "input")
            return receipt

    async def _reconcile(
        self, session_id: str, type_: InboxItemType, item_id: str
    ) -> InboxItem | None:
        found = await self._store.queries.admission(item_id)
        if found is None:
            return None
        if found.session_id != session_id or found.type != type_:
            raise ConflictError(
                f"id {item_id} is already used by another session or input type",
                resource="message",
            )
        return found

    async def _enqueue(
        self,
        session_id: str,
        type_: InboxItemType,
        item_id: str | None,
        delivery: Delivery,
        payload: Mapping[str, Any],
    ) -> InboxItem:
        receipt: InboxItem = await self._owners.command(
            session_id,
            lambda _: self._enqueue_in_actor(session_id, type_, item_id, delivery, payload),
        )
        return receipt

    async def _enqueue_in_actor(
        self,
        session_id: str,
        type_: InboxItemType,
        item_id: str | None,
        delivery: Delivery,
        payload: Mapping[str, Any],
    ) -> InboxItem:
        """:meth:`_enqueue`, run by the session's actor."""
        inbox_id = item_id or ids.message_id()
        # A concurrent exact retry may have admitted the id while we prepared.
        if item_id is not None:
            existing = await self._reconcile(session_id, type_, item_id)
            if existing is not None:
                return existing
        event = ev.InboxEnqueued(
            session_id=session_id,
            inbox_id=inbox_id,
            item=ev.EnqueuedItem(type=type_, payload=payload, delivery=delivery),
        )
        # A prompt commits a staged revert in its own transaction. Staged ones
        # are rare: the prompt goes first with a check that there is none
        # (no read before it), and only a refusal reads the session.
        checks: tuple[Op, ...] = ()
        if type_ == "user" and self.revert_commit is not None:
            checks = (no_staged_revert(session_id),)
        try:
            try:
                *_, record = await self._store.append(Command.of(event, checks=checks))
            except ProjectionConflict as exc:
                if exc.reason != "session.reverted":
                    raise
                before: list[ev.Event] = []
                session = await self._store.queries.session(session_id)
                if session is not None and session.revert is not None:
                    assert self.revert_commit is not None
                    # Committed atomically with the prompt that replaces it.
                    before = await self.revert_commit(session)
                *_, record = await self._store.append(Command.of(*before, event))
        except ProjectionConflict as exc:
            if exc.reason == "session.missing":
                raise SessionNotFoundError(session_id) from None
            # Taken in another session between our check and the commit.
            raced = await self._reconcile(session_id, type_, inbox_id)
            if raced is None:
                raise ConflictError(str(exc), resource="message") from None
            return raced
        return InboxItem(
            id=inbox_id,
            session_id=session_id,
            type=type_,
            delivery=delivery,
            time_created=record.created,
            payload=payload,
        )

    # -- pending input --------------------------------------------------------------------------

    async def pending(self, session_id: str) -> list[InboxItem]:
        await self._require(session_id)
        return await self._store.queries.inbox(session_id)

    async def cancel(self, session_id: str, inbox_id: str) -> None:
        await self._require(session_id)
        ids.validate("msg", inbox_id, field="inboxID")

        async def cancel(_: Writer) -> None:
            pending = await self._store.queries.inbox(session_id)
            if not any(item.id == inbox_id for item in pending):
                if await self._store.queries.was_cancelled(session_id, inbox_id):
                    return  # a second cancel: answered like the first, nothing written
                raise ConflictError(f"inbox item {inbox_id} is not pending", resource="inbox")
            await self._apply(ev.InboxCancelled(session_id=session_id, inbox_id=inbox_id))

        await self._owners.command(session_id, cancel)

    async def change_delivery(self, session_id: str, inbox_id: str, delivery: Delivery) -> None:
        await self._require(session_id)
        ids.validate("msg", inbox_id, field="inboxID")

        async def change(_: Writer) -> None:
            item = await self._pending_item(session_id, inbox_id)
            if item.delivery == delivery:
                raise ConflictError(
                    f"inbox item {inbox_id} is already delivered by {delivery}",
                    resource="inbox",
                )
            changed = ev.InboxDeliveryChanged(
                session_id=session_id, inbox_id=inbox_id, delivery=delivery
            )
            await self._apply(changed)

        with self.gate.admitting():
            await self._owners.command(session_id, change)
            # Steering asks for the next boundary; queueing and cancelling never wake.
            if delivery == "steer":
                self._wake(session_id, "steer")

    # -- promotion ------------------------------------------------------------------------------

    async def drain_start(self, session_id: str, writer: Writer) -> DrainStart:
        """A drain's first read (run by the session actor, which then knows its inbox)."""
        start = await self._store.queries.drain_start(session_id)
        writer.inbox = list(start.inbox)
        return start

    async def boundary(self, session_id: str, writer: Writer) -> Boundary:
        """A boundary's read (run by the session actor, which then knows its inbox)."""
        boundary = await self._store.queries.boundary(session_id)
        writer.inbox = list(boundary.inbox)
        return boundary

    async def promote(
        self, session_id: str, scope: Scope, held: Collection[str], writer: Writer
    ) -> Promotion:
        """Deliver what ``scope`` allows, in one transaction; say what it delivered and left.

        Run by the session actor: the pending input it knows (the boundary's
        read, or the last promotion's leftovers, with no other command since)
        is what a read would give, and the read is skipped. Another host's
        cancellation still races it; the delivery's projection refuses an
        item no longer pending, and promotion then reads afresh.
        ``held``: synthetic input held behind a staged revert (never delivered).
        """
        pending: Sequence[InboxItem] | None = writer.inbox
        writer.inbox = None
        if pending is not None:
            chosen = select_promotable(pending, scope, held)
            try:
                await self._deliver(session_id, chosen)
            except ConflictError:
                pending = None  # changed by another host since it was read: read it now
        if pending is None:
            pending = await self._store.queries.inbox(session_id)
            chosen = select_promotable(pending, scope, held)
            await self._deliver(session_id, chosen)
        delivered = {item.id for item in chosen}
        left = [item for item in pending if item.id not in delivered]
        writer.inbox = left
        return Promotion(chosen, left)

    async def nothing_due(self, scope: Scope, held: Collection[str], writer: Writer) -> bool:
        """Whether the idle boundary after a turn has nothing to deliver or handle,
        known without reading the inbox again.

        Only where this process alone writes the log (``Store.exclusive``), and
        only while the session actor still knows its inbox (no command since
        the promotion). With other hosts on the log, input they admitted
        meanwhile is found by the read (their wake would bring it too, one
        drain later).
        """
        known = writer.inbox
        return self._store.exclusive and known is not None and not due(known, scope, held)

    async def _deliver(self, session_id: str, chosen: Sequence[InboxItem]) -> None:
        if chosen:
            await self._apply(
                *(ev.InboxDelivered(session_id=session_id, inbox_id=i.id) for i in chosen)
            )

    # -- helpers --------------------------------------------------------------------------------

    async def _directory(self, session_id: str) -> Path:
        """The session's Location: attachments are read from inside it only."""
        session = await self._store.queries.session(session_id)
        if session is None:
            raise SessionNotFoundError(session_id)
        return Path(session.location.directory)

    async def _require(self, session_id: str) -> None:
        ids.validate("ses", session_id, field="sessionID")
        if await self._store.queries.session(session_id) is None:
            raise SessionNotFoundError(session_id)

    async def _pending_item(self, session_id: str, inbox_id: str) -> InboxItem:
        for item in await self._store.queries.inbox(session_id):
            if item.id == inbox_id:
                return item
        raise ConflictError(f"inbox item {inbox_id} is not pending", resource="inbox")

    async def _apply(self, *events: ev.Event) -> None:
        try:
            await self._store.append(Command.of(*events))
        except ProjectionConflict as exc:
            raise ConflictError(str(exc), resource="inbox") from None


@attrs.frozen
class Due:
    """What a boundary delivers: input items to promote, or one control item, or nothing."""

    inputs: tuple[InboxItem, ...] = ()
    control: InboxItem | None = None

    def __bool__(self) -> bool:
        return bool(self.inputs) or self.control is not None


NOTHING_DUE: Final = Due()


def due(pending: Sequence[InboxItem], scope: Scope, held: Collection[str] = ()) -> Due:
    """What a boundary at ``scope`` delivers from ``pending`` (in enqueue order).

    The rules, in one place:

    - Items in ``held`` (synthetic input admitted while a revert is staged) are
      not there at all until the revert is cleared or committed.
    - The first control item (compaction, move) is a boundary: nothing behind
      it is looked at, so later input never crosses it.
    - The steers ahead of it deliver, in order, at any boundary.
    - Failing those, the control item is due if it is a steer (queued input
      ahead of it does not hold it back), or, at the idle boundary (``input``),
      if nothing is ahead of it.
    - Failing that, at the idle boundary, the oldest queued item delivers.
    """
    ahead: list[InboxItem] = []
    control: InboxItem | None = None
    for item in pending:
        if held and item.id in held:
            continue
        if item.type in CONTROL_TYPES:
            control = item
            break
        ahead.append(item)
    steers = tuple(item for item in ahead if item.delivery == "steer")
    if steers:
        return Due(inputs=steers)
    if control is not None and (control.delivery == "steer" or (scope == "input" and not ahead)):
        return Due(control=control)
    if scope == "input" and ahead:
        return Due(inputs=(ahead[0],))
    return NOTHING_DUE


def select_promotable(
    pending: Sequence[InboxItem], scope: Scope, held: Collection[str] = ()
) -> list[InboxItem]:
    """The input items (never a control item) a promotion at ``scope`` delivers (:func:`due`)."""
    return list(due(pending, scope, held).inputs)


def control_head(
    pending: Sequence[InboxItem], scope: Scope, held: Collection[str] = ()
) -> InboxItem | None:
    """The control item due at this boundary, if any (:func:`due`)."""
    return due(pending, scope, held).control


def _compact(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}
