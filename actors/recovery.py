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

from actors._blocking import BlockingExecutor
from actors.execution import Execution
from actors.reaper import reap_stale_tools
from actors.sessions import Sessions
from protocol import events as ev
from protocol.errors import DomainError
from protocol.requests import SyntheticInput
from storage import Claim, Command, StorageError, Store

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
    skipped_running: tuple[str, ...] = ()


async def recover(
    store: Store,
    sessions: Sessions,
    execution: Execution,
    blocking: BlockingExecutor,
    *,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
) -> RecoveryReport:
    stale = await reap_stale_tools(store, blocking, running=execution.active)
    claims = await store.queries.claims()
    if not claims:
        return RecoveryReport(stale_tools=stale)
    running = set(await execution.active())
    children = [c for c in claims if c.parent_id is not None and c.session_id not in running]
    roots = [c for c in claims if c.parent_id is None]
    skipped = tuple(c.session_id for c in roots if c.session_id in running)
    todo = [c for c in roots if c.session_id not in running]

    await asyncio.gather(*(_release_orphan(store, c) for c in children))
    # Every claimed session starts at once; none waits for another.
    outcomes = await asyncio.gather(
        *(_resume(store, sessions, execution, c, max_attempts) for c in todo),
        return_exceptions=True,
    )
    resumed, exhausted = [], []
    for claim, outcome in zip(todo, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            log.error("recovering %s failed", claim.session_id, exc_info=outcome)
        elif outcome:
            resumed.append(claim.session_id)
        else:
            exhausted.append(claim.session_id)
    return RecoveryReport(
        stale_tools=stale,
        resumed=tuple(resumed),
        exhausted=tuple(exhausted),
        orphans_released=tuple(c.session_id for c in children),
        skipped_running=skipped,
    )


async def _release_orphan(store: Store, claim: Claim) -> None:
    await store.append(
        Command.of(
            ev.ExecutionFailed(
                session_id=claim.session_id,
                error=ev.ErrorInfo(type="aborted", message="Child execution orphaned by a restart"),
            )
        )
    )


async def _resume(
    store: Store,
    sessions: Sessions,
    execution: Execution,
    claim: Claim,
    max_attempts: int,
) -> bool:
    attempt = claim.resume_attempts + 1
    # Counted durably before anything else: a crash from here on still counts.
    await store.append(
        Command.of(ev.ExecutionRecovering(session_id=claim.session_id, attempt=attempt))
    )
    if attempt > max_attempts:
        await store.append(
            Command.of(
                ev.ExecutionFailed(
                    session_id=claim.session_id,
                    error=ev.ErrorInfo(
                        type="aborted",
                        message=f"Gave up after {max_attempts} attempts to resume after restarts",
                    ),
                )
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
