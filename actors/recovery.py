"""Startup recovery: resume what a dead process left claimed, never replay a tool.

A write-ahead claim (``session.time_claimed``) is taken with
``session.execution.started`` and released only by a releasing terminal
(succeeded, failed, interrupted by the user). A claim that survives means the
process that owned the execution died or shut down mid-work. The sweep:

0. kills the process group of every tool call left without a terminal (as
   recorded by ``session.tool.spawned``, and only while it is still that
   group: same start time, same boot), all at once, and only then fails
   those calls as stale (``aborted``); see :mod:`actors.reaper`;
1. releases the claims of orphaned child sessions: nothing will resume a
   child on its own, so each gets ``execution.failed {type: "aborted"}``;
2. for every claimed top-level session not already running here, all at once:
   durably records the next attempt (``session.execution.recovering``)
   *before* resuming; past the bound it publishes ``execution.failed
   {type: "aborted"}`` instead (which releases the claim); otherwise it admits
   a synthetic "Continuing after restart" notice and wakes the session.

Several hosts: a claim is recovered only once no host holds its lease live
(:mod:`storage.lease`): the lease expired with a host that died or paused, or
a host shutting down released it. Taking the lease is part of the command
that counts the attempt (and of an orphan's failure), with the claim and the
seq read again in that command of the session's actor (its only writer here),
so of all the hosts scanning at once exactly one recovers a session; the
others see the lease held, or the log moved, and leave it. The
runtime runs the sweep at start and then periodically, and at once for the
sessions another host announces it released. Tool calls are reaped only for
sessions no host holds a live lease on.

The sweep never clears a claim itself; only a terminal does. A crash anywhere
during recovery therefore leaves the same claims, one attempt further, for the
next boot. The resumed drain fails tool calls still projected as running
(``aborted``) before any model work: an interrupted side effect is reported,
never repeated. Exactly-once provider requests or tool effects are not
promised.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from typing import Final

import attrs

from actors.kit import BlockingExecutor
from actors.lease_keeper import LeaseKeeper
from actors.reaper import reap_stale_tools
from actors.session.inbox import Run, Writer
from actors.sessions import Sessions
from actors.supervisor import Execution
from protocol import events as ev
from protocol.errors import DomainError, ServiceUnavailableError
from protocol.requests import SyntheticInput
from storage import (
    Claim,
    Command,
    DivergedError,
    Fence,
    LeaseHeldError,
    LeaseUse,
    SeqConflictError,
    StorageError,
    Store,
)

__all__ = ["DEFAULT_MAX_ATTEMPTS", "RESTART_NOTICE", "RecoveryReport", "recover"]

log = logging.getLogger(__name__)

DEFAULT_MAX_ATTEMPTS: Final = 10
RESTART_NOTICE: Final = "Continuing after restart"


@attrs.frozen(kw_only=True)
class RecoveryReport:
    #: Tool calls whose recorded process groups were killed and the calls failed.
    stale_tools: tuple[str, ...] = ()
    resumed: tuple[str, ...] = ()
    exhausted: tuple[str, ...] = ()
    orphans_released: tuple[str, ...] = ()
    #: Claimed sessions left alone: running here, or leased live by another host.
    skipped_running: tuple[str, ...] = ()
    #: Claimed sessions another host recovered first (in this very scan).
    taken_elsewhere: tuple[str, ...] = ()


#: Another host took the lease, or the log moved since the claims were read.
_LOST_RACE = (LeaseHeldError, SeqConflictError, DivergedError)


async def recover(
    store: Store,
    sessions: Sessions,
    execution: Execution,
    blocking: BlockingExecutor,
    keeper: LeaseKeeper,
    *,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
) -> RecoveryReport:
    """Recover every claimed session nobody runs.

    Every write is a command of the session's actor (``sessions.owners``),
    which reads again what the write depends on (the claim, its lease, the
    seq, whether it runs here) inside the same command: no other command of
    the session comes between them. The runtime opens its execution before
    its first sweep, so the actors are there for the one at start too.
    """

    async def busy() -> set[str]:
        leases = await store.queries.leases(live_at=keeper.clock.now_ms())
        live = {lease.session_id for lease in leases}
        return live | set(await execution.active())

    owners = sessions.owners
    stale = await reap_stale_tools(store, blocking, owners, keeper.clock, running=busy)
    claims = await store.queries.claims()
    if not claims:
        return RecoveryReport(stale_tools=stale)
    # What the claims say now picks the candidates; each command decides again.
    running = set(await execution.active())
    now = keeper.clock.now_ms()
    free = [c for c in claims if c.session_id not in running and c.orphaned(now)]
    skipped = [c.session_id for c in claims if c not in free and c.parent_id is None]
    children = [c for c in free if c.parent_id is not None]
    todo = [c for c in free if c.parent_id is None]

    released = await asyncio.gather(
        *(owners.command(c.session_id, _release_orphan(store, keeper, c)) for c in children),
        return_exceptions=True,
    )
    # Every claimed session starts at once; none waits for another.
    outcomes = await asyncio.gather(
        *(_resume(store, sessions, execution, keeper, c, max_attempts) for c in todo),
        return_exceptions=True,
    )
    resumed, exhausted, elsewhere, orphans = [], [], [], []
    for claim, outcome in zip([*children, *todo], [*released, *outcomes], strict=True):
        if isinstance(outcome, ServiceUnavailableError):
            raise outcome  # execution stopped: the runtime is closing
        if isinstance(outcome, _LOST_RACE):
            elsewhere.append(claim.session_id)
        elif isinstance(outcome, BaseException):
            log.error("recovering %s failed", claim.session_id, exc_info=outcome)
        elif outcome is _Outcome.SKIPPED:
            # Started here, or released, since the claims were read.
            if claim.parent_id is None:
                skipped.append(claim.session_id)
        elif outcome is _Outcome.RELEASED:
            orphans.append(claim.session_id)
        elif outcome is _Outcome.RESUMED:
            resumed.append(claim.session_id)
        else:
            exhausted.append(claim.session_id)
    return RecoveryReport(
        stale_tools=stale,
        resumed=tuple(resumed),
        exhausted=tuple(exhausted),
        orphans_released=tuple(orphans),
        skipped_running=tuple(skipped),
        taken_elsewhere=tuple(elsewhere),
    )


class _Outcome(enum.Enum):
    SKIPPED = "skipped"
    RELEASED = "released"
    RESUMED = "resumed"
    EXHAUSTED = "exhausted"


async def _still_free(
    store: Store, keeper: LeaseKeeper, writer: Writer, claim: Claim
) -> int | None:
    """In the session's command: its seq if the claim read is still there and
    free (not running here, no live lease), else None.

    The seq is read first: a write another host makes after it fails the
    append that expects it, so the claim read after it cannot be staler.
    """
    if writer.busy:
        return None  # a busy period started here since the claims were read
    seq = await store.last_seq(claim.session_id)
    now = keeper.clock.now_ms()
    current = next(iter(await store.queries.claims(claim.session_id)), None)
    if current is None or not current.orphaned(now):
        return None
    if current.resume_attempts != claim.resume_attempts:
        return None  # counted by another sweep meanwhile: the next scan reads it
    return seq


def _release_orphan(store: Store, keeper: LeaseKeeper, claim: Claim) -> Run:
    async def release(writer: Writer) -> _Outcome:
        seq = await _still_free(store, keeper, writer, claim)
        if seq is None:
            return _Outcome.SKIPPED
        # Taken for no time at all: the take only decides who fails it.
        await store.append(
            Command.of(
                ev.ExecutionFailed(
                    session_id=claim.session_id,
                    error=ev.ErrorInfo(
                        type="aborted", message="Child execution orphaned by a restart"
                    ),
                ),
                expected={claim.session_id: seq},
                lease=LeaseUse.take(claim.session_id, keeper.host_id, 0),
            )
        )
        return _Outcome.RELEASED

    return release


async def _resume(
    store: Store,
    sessions: Sessions,
    execution: Execution,
    keeper: LeaseKeeper,
    claim: Claim,
    max_attempts: int,
) -> _Outcome:
    attempt = claim.resume_attempts + 1

    async def count(writer: Writer) -> _Outcome:
        seq = await _still_free(store, keeper, writer, claim)
        if seq is None:
            return _Outcome.SKIPPED
        # Counted durably before anything else: a crash from here on still
        # counts. The lease taken with it keeps every other host off until
        # this host's own start takes it again (same host: allowed, epoch + 1).
        [counted] = await store.append(
            Command.of(
                ev.ExecutionRecovering(session_id=claim.session_id, attempt=attempt),
                expected={claim.session_id: seq},
                lease=keeper.take(claim.session_id),
            )
        )
        if attempt <= max_attempts:
            return _Outcome.RESUMED
        assert counted.epoch is not None
        fence = Fence(claim.session_id, keeper.host_id, counted.epoch)
        await store.append(
            Command.of(
                ev.ExecutionFailed(
                    session_id=claim.session_id,
                    error=ev.ErrorInfo(
                        type="aborted",
                        message=f"Gave up after {max_attempts} attempts to resume after restarts",
                    ),
                ),
                lease=fence.release(),
            )
        )
        return _Outcome.EXHAUSTED

    outcome: _Outcome = await sessions.owners.command(claim.session_id, count)
    if outcome is not _Outcome.RESUMED:
        return outcome
    try:
        # Its own command (an admission, like any other): what it decides
        # depends on nothing the count read.
        await sessions.synthetic(
            claim.session_id,
            SyntheticInput(
                text=RESTART_NOTICE,
                description=RESTART_NOTICE,
                metadata={"notice": "restart", "attempt": attempt},
                resume=False,
            ),
        )
    except (DomainError, StorageError):
        log.exception("could not admit the restart notice for %s", claim.session_id)
        raise
    execution.wake(claim.session_id, "input")
    return outcome
