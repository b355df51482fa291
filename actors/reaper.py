"""Stale tool calls: kill what a dead process left running, then fail the call.

A tool call that has ``session.tool.called`` but no terminal was cut off by a
crash or a restart. If it started a process group, ``session.tool.spawned``
recorded it (projected into ``tool_process`` until the terminal), and the
group may still be running under init, about to do its side effect. So the
order is fixed: first kill every such group that is still the one recorded
(same leader start time, same boot; see :mod:`actors.tools._process`), all at
once, then publish the call's failure. The call is never replayed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from typing import Final

from actors.kit import BlockingExecutor
from actors.session.inbox import Owners, Run, Writer
from actors.tools._process import ProcessGroup, kill_stale
from protocol import events as ev
from storage import Command, ProjectionConflict, Store, ToolProcess
from storage.clock import Clock

__all__ = ["STALE_KILL_GRACE_S", "kill_recorded", "reap_stale_tools", "stale_failure"]

log = logging.getLogger(__name__)

#: SIGTERM to SIGKILL for a stale group: nobody waits on its output any more.
STALE_KILL_GRACE_S: Final = 0.5


def stale_failure(
    session_id: str,
    assistant_message_id: str,
    call_id: str,
    name: str,
    *,
    executed: bool = True,
) -> ev.ToolFailed:
    """The terminal of a call whose execution a restart cut off.

    ``executed`` is False only for a call known never to have started: one
    still waiting on its unanswered permission ask.
    """
    return ev.ToolFailed(
        session_id=session_id,
        assistant_message_id=assistant_message_id,
        id=call_id,
        error=ev.ErrorInfo(type="aborted", message=f"Tool execution interrupted: {name}"),
        executed=executed,
    )


async def kill_recorded(blocking: BlockingExecutor, records: Sequence[ToolProcess]) -> None:
    """Kill the recorded groups that are still the ones recorded, all at once."""
    if not records:
        return
    groups = [
        ProcessGroup(pgid=r.pgid, start_ticks=r.start_ticks, boot_id=r.boot_id) for r in records
    ]
    killed = await blocking.run(kill_stale, groups, STALE_KILL_GRACE_S)
    for group in killed:
        log.warning("killed process group %d left running by a stale tool call", group.pgid)


async def _none() -> Iterable[str]:
    return ()


async def reap_stale_tools(
    store: Store,
    blocking: BlockingExecutor,
    owners: Owners,
    clock: Clock,
    *,
    running: Callable[[], Awaitable[Iterable[str]]] = _none,
) -> tuple[str, ...]:
    """Kill every recorded stale group, then fail its call; returns the calls' ids.

    ``running`` lists the sessions busy in this process: their records may
    belong to live tools and are left alone. It is asked *after* the records
    are read: a live tool's record exists only while its session is busy, so
    every such record read is then excluded, even one of a session that
    started after the read.

    The failures are a command of each session's actor (``owners``), which
    reads again, in that command, that the session is still not running (here
    or under anyone's live lease) and which calls are still open: a drain
    that started since fails them itself, and nothing comes between that read
    and the write.
    """
    records = await store.queries.tool_processes()
    if not records:
        return ()
    busy = set(await running())
    records = [r for r in records if r.session_id not in busy]
    await kill_recorded(blocking, records)
    by_session: dict[str, list[ToolProcess]] = {}
    for r in records:
        by_session.setdefault(r.session_id, []).append(r)
    failed = await asyncio.gather(
        *(
            owners.command(sid, _fail_stale(store, clock, sid, {r.call_id for r in mine}))
            for sid, mine in by_session.items()
        ),
        return_exceptions=True,
    )
    calls: list[str] = []
    for outcome in failed:
        if isinstance(outcome, BaseException):
            # The execution stopped (the runtime is closing), or the database
            # refused: the sweep says so, as it did before (the next one retries).
            raise outcome
        calls.extend(outcome)
    return tuple(calls)


def _fail_stale(store: Store, clock: Clock, session_id: str, killed: Collection[str]) -> Run:
    async def fail(writer: Writer) -> list[str]:
        if writer.busy:
            return []  # its drain fails them (a busy period started since the read)
        leases = await store.queries.leases(live_at=clock.now_ms())
        if any(lease.session_id == session_id for lease in leases):
            return []  # a host runs it (or is about to): its drain fails them
        failed: list[str] = []
        for r in await store.queries.tool_processes(session_id):
            if r.call_id not in killed:
                continue  # recorded since the read: not this sweep's to fail
            # A session deleted meanwhile took the call (and the record) with it.
            with contextlib.suppress(ProjectionConflict):
                await store.append(
                    Command.of(stale_failure(session_id, r.assistant_message_id, r.call_id, r.name))
                )
                failed.append(r.call_id)
        return failed

    return fail
