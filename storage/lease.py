"""Execution leases and fencing: which host runs a session, under which epoch.

The write-ahead claim (``session.time_claimed``, taken by
``session.execution.started``) says a session has work that must finish. The
lease says who does it: one ``session_lease`` row per session that ever ran
(host id, fencing epoch, expiry in ms). The claim and the lease are taken in
one command, the execution's ``started``, which carries a :class:`LeaseUse`
of kind ``take``: in the same savepoint the row is inserted, or taken over
when it has expired or is already this host's, with ``epoch + 1`` each time;
a live lease of another host refuses the command (:class:`LeaseHeldError`).

Every later append of that execution carries its :class:`Fence` (``hold``);
the store accepts it only while the row still names that host and epoch and
has not expired, and otherwise rejects the whole command in its savepoint
(:class:`FencedError`): a host that lost its lease (a pause, a partition, an
expiry) can write nothing more for that session. The execution's terminal
carries ``release``: the row expires at once, so any host may take it. A
``renew`` (no events) pushes the expiry forward while the host works.

An execution does not thread its fence through every call that appends: it
runs its drains inside :func:`fenced`, and the store applies the fence in
force (:func:`apply_fence`) to each command that touches the session and
names no lease of its own; tasks started from a drain inherit it.

The rules are :func:`use_lease`, one pure function every backend's writer
calls with the row as it read it and its clock (SQLite's writer the
process's; PostgreSQL's the server's, so hosts whose clocks disagree still
agree on expiry); the writer stores the row it returns.

Which epoch and host wrote each fenced event is recorded (``event_fence``),
so that "no two hosts wrote one session under overlapping epochs" can be
checked after the fact. Neither table is a projection: the lease is not
derived from the log and survives a rebuild of the projections.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import secrets
import socket
from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal

import attrs

from storage.errors import FencedError, LeaseHeldError

if TYPE_CHECKING:
    from storage.recorder import Command

__all__ = [
    "Fence",
    "Lease",
    "LeaseRow",
    "LeaseUse",
    "apply_fence",
    "default_host_id",
    "fenced",
    "use_lease",
]

LeaseKind = Literal["take", "hold", "renew", "release"]


@attrs.frozen
class Fence:
    """The lease an execution holds: what each of its appends is checked against."""

    session_id: str
    host_id: str
    epoch: int

    def hold(self) -> LeaseUse:
        return LeaseUse(
            kind="hold", session_id=self.session_id, host_id=self.host_id, epoch=self.epoch
        )

    def renew(self, ttl_ms: int) -> LeaseUse:
        return LeaseUse(
            kind="renew",
            session_id=self.session_id,
            host_id=self.host_id,
            epoch=self.epoch,
            ttl_ms=ttl_ms,
        )

    def release(self) -> LeaseUse:
        return LeaseUse(
            kind="release", session_id=self.session_id, host_id=self.host_id, epoch=self.epoch
        )


@attrs.frozen(kw_only=True)
class LeaseUse:
    """What a command does with a session's lease before its events are stored."""

    kind: LeaseKind
    session_id: str
    host_id: str
    #: The epoch held (hold/renew/release); ignored by ``take``.
    epoch: int = 0
    #: How long from now the lease lives (take/renew).
    ttl_ms: int = 0

    @classmethod
    def take(cls, session_id: str, host_id: str, ttl_ms: int) -> LeaseUse:
        return cls(kind="take", session_id=session_id, host_id=host_id, ttl_ms=ttl_ms)


@attrs.frozen(kw_only=True)
class Lease:
    """A ``session_lease`` row as read."""

    session_id: str
    host_id: str
    epoch: int
    expires: int

    def live(self, now: int) -> bool:
        return self.expires > now


#: A ``session_lease`` row as a writer holds it, (host_id, epoch, expires in
#: ms), or None: the session has none.
LeaseRow = tuple[str, int, int] | None


def use_lease(row: LeaseRow, use: LeaseUse, now: int) -> tuple[LeaseRow, int]:
    """The row after ``use`` at ``now`` (ms), and the epoch the command holds.

    ``take``: allowed when there is no row, the row expired, or it is this
    host's already; the epoch goes up by one. Every other use needs the row
    live, at ``use``'s host and epoch; ``renew`` moves the expiry, ``release``
    expires it at once. Raises :class:`LeaseHeldError` (a take) or
    :class:`FencedError` (the others); the row is then unchanged.
    """
    sid = use.session_id
    if use.kind == "take":
        if row is not None and row[2] > now and row[0] != use.host_id:
            raise LeaseHeldError(sid, row[0], row[1])
        epoch = 1 if row is None else row[1] + 1
        return (use.host_id, epoch, now + use.ttl_ms), epoch
    if row is None:
        raise FencedError(sid, use.host_id, use.epoch, "no lease was taken")
    host_id, epoch, expires = row
    if (host_id, epoch) != (use.host_id, use.epoch):
        raise FencedError(sid, use.host_id, use.epoch, f"host {host_id} holds epoch {epoch}")
    if expires <= now:
        raise FencedError(sid, use.host_id, use.epoch, "the lease expired")
    if use.kind == "renew":
        return (host_id, epoch, now + use.ttl_ms), epoch
    if use.kind == "release":
        return (host_id, epoch, 0), epoch
    return row, epoch


def default_host_id() -> str:
    """A host id stable for this process: the machine's name, the pid and a random tail."""
    name = socket.gethostname().split(".")[0][:24] or "host"
    return f"{name}-{os.getpid()}-{secrets.token_hex(3)}"


#: The fence in force: its session and the use every append of it makes (one
#: LeaseUse for the whole context, not one per append).
_FENCE: contextvars.ContextVar[tuple[str, LeaseUse] | None] = contextvars.ContextVar(
    "fence", default=None
)


@contextlib.contextmanager
def fenced(fence: Fence | None) -> Iterator[None]:
    """Appends made in this context (and tasks it starts) for ``fence``'s session hold it."""
    token = _FENCE.set(None if fence is None else (fence.session_id, fence.hold()))
    try:
        yield
    finally:
        _FENCE.reset(token)


def apply_fence(command: Command) -> Command:
    """``command`` with the fence in force, when it touches that session and names no lease."""
    held = _FENCE.get()
    if held is None or command.lease is not None:
        return command
    session_id, hold = held
    for e in command.events:
        if e.aggregate_id == session_id:
            return command.with_lease(hold)
    return command
