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
that counts the attempt (and of an orphan's failure), with the seq read when
the claims were, so of all the hosts scanning at once exactly one recovers a
session; the others see the lease held, or the log moved, and leave it. The
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
import logging
from typing import Final

import attrs

from actors.kit import BlockingExecutor
from actors.lease_keeper import LeaseKeeper
from actors.reaper import reap_stale_tools
from actors.sessions import Sessions
from actors.supervisor import Execution
from protocol import events as ev
from protocol.errors import DomainError
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
    """Recover every claimed session nobody runs."""

    async def busy() -> set[str]:
        leases = await store.queries.leases(live_at=keeper.clock.now_ms())
        live = {lease.session_id for lease in leases}
        return live | set(await execution.active())

    stale = await reap_stale_tools(store, blocking, running=busy)
    claims = await store.queries.claims()
    if not claims:
        return RecoveryReport(stale_tools=stale)
    running = set(await execution.active())
    now = keeper.clock.now_ms()
    free = [c for c in claims if c.session_id not in running and c.orphaned(now)]
    skipped = tuple(c.session_id for c in claims if c not in free and c.parent_id is None)
    children = [c for c in free if c.parent_id is not None]
    todo = [c for c in free if c.parent_id is None]
    seqs = await asyncio.gather(*(store.last_seq(c.session_id) for c in free))
    seq_of = {c.session_id: seq for c, seq in zip(free, seqs, strict=True)}

    released = await asyncio.gather(
        *(_release_orphan(store, keeper, c, seq_of[c.session_id]) for c in children),
        return_exceptions=True,
    )
    # Every claimed session starts at once; none waits for another.
    outcomes = await asyncio.gather(
        *(
            _resume(store, sessions, execution, keeper, c, seq_of[c.session_id], max_attempts)
            for c in todo
        ),
        return_exceptions=True,
    )
    resumed, exhausted, elsewhere = [], [], []
    for claim, outcome in zip([*children, *todo], [*released, *outcomes], strict=True):
        if isinstance(outcome, _LOST_RACE):
            elsewhere.append(claim.session_id)
        elif isinstance(outcome, BaseException):
            log.error("recovering %s failed", claim.session_id, exc_info=outcome)
        elif claim.parent_id is not None:
            pass
        elif outcome:
            resumed.append(claim.session_id)
        else:
            exhausted.append(claim.session_id)
    return RecoveryReport(
        stale_tools=stale,
        resumed=tuple(resumed),
        exhausted=tuple(exhausted),
        orphans_released=tuple(
            c.session_id
            for c, outcome in zip(children, released, strict=True)
            if not isinstance(outcome, BaseException)
        ),
        skipped_running=skipped,
        taken_elsewhere=tuple(elsewhere),
    )


async def _release_orphan(store: Store, keeper: LeaseKeeper, claim: Claim, seq: int) -> None:
    # Taken for no time at all: the take only decides who fails it.
    await store.append(
        Command.of(
            ev.ExecutionFailed(
                session_id=claim.session_id,
                error=ev.ErrorInfo(type="aborted", message="Child execution orphaned by a restart"),
            ),
            expected={claim.session_id: seq},
            lease=LeaseUse.take(claim.session_id, keeper.host_id, 0),
        )
    )


async def _resume(
    store: Store,
    sessions: Sessions,
    execution: Execution,
    keeper: LeaseKeeper,
    claim: Claim,
    seq: int,
    max_attempts: int,
) -> bool:
    attempt = claim.resume_attempts + 1
    # Counted durably before anything else: a crash from here on still counts.
    # The lease taken with it keeps every other host off until this host's own
    # start takes it again (same host: allowed, epoch + 1).
    [counted] = await store.append(
        Command.of(
            ev.ExecutionRecovering(session_id=claim.session_id, attempt=attempt),
            expected={claim.session_id: seq},
            lease=keeper.take(claim.session_id),
        )
    )
    if attempt > max_attempts:
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
        return False
    try:
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
    return True
