"""Several hosts on one log: placement, forwarding over the host bus, fencing, handover.

Two runtimes (hosts ``host-a`` and ``host-b``) share one real SQLite store and
one in-process :class:`~actors.host_messages.LocalHostBus`; each has its own
execution, leases, renewal and scan, exactly as two servers on one PostgreSQL
database would.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hosts import Hosts, RecordingBus

from actors.recovery import RESTART_NOTICE
from actors.runtime import Runtime, RuntimeConfig
from protocol import SyntheticMessage
from protocol import events as ev
from protocol.errors import ServiceUnavailableError
from protocol.requests import PromptInput
from storage import Command, Fence, FencedError, SQLiteStore

SLEEP = '#tool bash {"command": "sleep 30"}'


@pytest.fixture
async def hosts(tmp_path: Path) -> AsyncIterator[Hosts]:
    async with SQLiteStore(tmp_path / "shared.sqlite") as store:
        h = Hosts(tmp_path, store, RecordingBus())
        async with h.stack:
            yield h
        h.events.close()


async def test_a_session_nobody_runs_runs_on_the_host_that_sees_the_wake(hosts: Hosts) -> None:
    a = await hosts.start("host-a")
    b = await hosts.start("host-b")
    s = await a.sessions.create()
    await a.sessions.prompt(s.id, PromptInput(text="one"))
    await a.execution.wait_idle(s.id)
    await b.sessions.prompt(s.id, PromptInput(text="two"))
    await b.execution.wait_idle(s.id)
    writers = await hosts.writers(s.id)
    assert {(host, epoch) for _, host, epoch in writers} == {("host-a", 1), ("host-b", 2)}
    assert [host for _, host, _ in writers] == sorted(host for _, host, _ in writers)
    assert await hosts.store.queries.claims() == []


async def test_a_wake_on_b_for_a_session_a_runs_runs_on_a(hosts: Hosts) -> None:
    a = await hosts.start("host-a")
    b = await hosts.start("host-b")
    s = await a.sessions.create()
    await a.sessions.prompt(s.id, PromptInput(text='#tool bash {"command": "sleep 0.5"}'))
    await hosts.feed.wait("session.tool.called", sessionID=s.id)
    await b.sessions.prompt(s.id, PromptInput(text="#text second answer"))
    await b.execution.wait_idle(s.id)  # B tried, found A's lease, handed the wake over
    forwarded = [
        (to, m) for to, m in hosts.bus.sent if m.kind == "wake" and m.session_ids == (s.id,)
    ]
    assert [(to, m.origin) for to, m in forwarded] == [("host-a", "host-b")]
    assert s.id not in await b.execution.active()
    await a.execution.wait_idle(s.id)
    writers = await hosts.writers(s.id)
    assert {host for _, host, _ in writers} == {"host-a"}
    types = [r.type for r in await hosts.store.read(s.id, limit=1000)]
    assert types.count("session.execution.started.1") == 1  # B wrote no start of its own
    assert await hosts.store.queries.claims() == []


async def test_an_interrupt_received_by_b_reaches_a(hosts: Hosts) -> None:
    a = await hosts.start("host-a")
    b = await hosts.start("host-b")
    s = await a.sessions.create()
    await a.sessions.prompt(s.id, PromptInput(text=SLEEP))
    await hosts.feed.wait("session.tool.called", sessionID=s.id)
    assert await b.interrupt(s.id) is True
    done = await asyncio.wait_for(
        hosts.feed.wait("session.execution.interrupted", sessionID=s.id), 10
    )
    assert done["data"]["reason"] == "user"
    await a.execution.wait_idle(s.id)
    assert {host for _, host, _ in await hosts.writers(s.id)} == {"host-a"}


async def test_a_resume_on_b_joins_the_execution_on_a(hosts: Hosts) -> None:
    a = await hosts.start("host-a")
    b = await hosts.start("host-b")
    s = await a.sessions.create()
    await a.sessions.prompt(s.id, PromptInput(text='#tool bash {"command": "sleep 0.5"}'))
    await hosts.feed.wait("session.tool.called", sessionID=s.id)
    terminal = await asyncio.wait_for(b.resume(s.id), 10)
    assert terminal.kind == "succeeded"
    assert {host for _, host, _ in await hosts.writers(s.id)} == {"host-a"}
    active = await b.active()
    assert s.id not in active


async def test_waiting_on_b_returns_once_a_settled(hosts: Hosts) -> None:
    a = await hosts.start("host-a")
    b = await hosts.start("host-b")
    s = await a.sessions.create()
    await a.sessions.prompt(s.id, PromptInput(text='#tool bash {"command": "sleep 0.5"}'))
    await hosts.feed.wait("session.tool.called", sessionID=s.id)
    await asyncio.wait_for(b.wait_idle(s.id), 10)
    assert hosts.feed.types(s.id)[-1] == "session.execution.succeeded"


async def test_active_says_which_host_runs_what(hosts: Hosts) -> None:
    a = await hosts.start("host-a")
    b = await hosts.start("host-b")
    s = await a.sessions.create()
    await a.sessions.prompt(s.id, PromptInput(text=SLEEP))
    await hosts.feed.wait("session.tool.called", sessionID=s.id)
    assert await b.active() == {s.id: ("host-a", 1)}
    assert await a.active() == {s.id: ("host-a", 1)}
    await a.interrupt(s.id)
    await a.execution.wait_idle(s.id)
    assert await b.active() == {}


async def test_a_paused_host_loses_its_lease_and_cannot_write_after_resuming(
    hosts: Hosts,
) -> None:
    a = await hosts.start("host-a", ttl_ms=400)
    b = await hosts.start("host-b", ttl_ms=400)
    s = await a.sessions.create()
    await a.sessions.prompt(s.id, PromptInput(text=SLEEP))
    await hosts.feed.wait("session.tool.called", sessionID=s.id)
    stale = a.leases.fence(s.id)
    assert stale is not None
    a.leases.suspend()  # A stops renewing, as a SIGSTOPped process would
    await asyncio.wait_for(hosts.feed.wait("session.execution.recovering", sessionID=s.id), 10)
    a.leases.suspend(False)
    with pytest.raises(FencedError):
        await hosts.store.append(
            Command.of(ev.SessionRenamed(session_id=s.id, title="late"), lease=stale.hold())
        )
    await asyncio.wait_for(a.execution.wait_idle(s.id), 10)  # A stopped on its own
    await hosts.feed.wait("session.execution.succeeded", sessionID=s.id)
    writers = await hosts.writers(s.id)
    first_b = next(i for i, (_, host, _) in enumerate(writers) if host == "host-b")
    assert all(host == "host-a" for _, host, _ in writers[:first_b])
    assert all(host == "host-b" for _, host, _ in writers[first_b:])  # A wrote nothing after
    assert writers[first_b][2] > stale.epoch
    messages = (await b.sessions.messages(s.id, order="asc")).data
    assert [m.text for m in messages if isinstance(m, SyntheticMessage)] == [RESTART_NOTICE]
    types = [r.type for r in await hosts.store.read(s.id, limit=1000)]
    assert types.count("session.tool.called.1") == 1  # the stale tool is failed, never rerun
    assert await hosts.store.queries.claims() == []


async def test_graceful_shutdown_hands_the_session_over_before_expiry(hosts: Hosts) -> None:
    a = await hosts.start("host-a")  # a 60 s lease: only the handover explains a quick move
    b = await hosts.start("host-b")
    s = await a.sessions.create()
    await a.sessions.prompt(s.id, PromptInput(text=SLEEP))
    await hosts.feed.wait("session.tool.called", sessionID=s.id)
    await a.aclose()
    released = [m for to, m in hosts.bus.sent if m.kind == "released"]
    assert [(m.origin, m.session_ids) for m in released] == [("host-a", (s.id,))]
    mark = len(hosts.feed.events)
    await hosts.feed.wait("session.execution.succeeded", 5, after=mark, sessionID=s.id)
    writers = await hosts.writers(s.id)
    assert writers[-1][1] == b.host_id == "host-b"
    types = [r.type for r in await hosts.store.read(s.id, limit=1000)]
    assert "session.execution.recovering.1" in types
    assert await hosts.store.queries.claims() == []


async def test_a_fence_from_the_previous_epoch_is_refused(hosts: Hosts) -> None:
    a = await hosts.start("host-a")
    s = await a.sessions.create()
    await a.sessions.prompt(s.id, PromptInput(text="one"))
    await a.execution.wait_idle(s.id)
    await a.sessions.prompt(s.id, PromptInput(text="two"))
    await a.execution.wait_idle(s.id)
    with pytest.raises(FencedError):
        await hosts.store.append(
            Command.of(
                ev.SessionRenamed(session_id=s.id, title="x"),
                lease=Fence(s.id, "host-a", 1).hold(),
            )
        )


async def test_a_wake_admitted_while_a_host_closes_runs_on_another(hosts: Hosts) -> None:
    a = await hosts.start("host-a")
    b = await hosts.start("host-b")
    busy, idle = await a.sessions.create(), await a.sessions.create()
    # A call that ignores SIGTERM keeps A's shutdown going for the kill's grace
    # (once the trap is in place: the marker says so).
    marker = hosts.tmp_path / "trapped"
    stubborn = "#tool bash " + json.dumps({"command": f'trap "" TERM; touch "{marker}"; sleep 30'})
    await a.sessions.prompt(busy.id, PromptInput(text=stubborn))
    await hosts.feed.wait("session.tool.spawned", sessionID=busy.id)
    async with asyncio.timeout(5):
        while not marker.exists():  # noqa: ASYNC110 (a file, not an event)
            await asyncio.sleep(0.005)
    closing = asyncio.create_task(a.aclose())
    async with asyncio.timeout(5):
        while not a.services.host_execution.closing:  # noqa: ASYNC110 (a flag, not an event)
            await asyncio.sleep(0.005)
    await a.sessions.prompt(idle.id, PromptInput(text="#text late"))
    await closing
    await hosts.feed.wait("session.execution.succeeded", sessionID=idle.id)
    assert {host for _, host, _ in await hosts.writers(idle.id)} == {b.host_id}


async def test_a_closed_host_refuses_admissions_instead_of_keeping_their_wake(
    hosts: Hosts,
) -> None:
    """Once a closing host has handed its refused wakes over, nobody would hear
    a new one: the admission is refused (503) and stores nothing."""
    a = await hosts.start("host-a")
    await hosts.start("host-b")
    s = await a.sessions.create()
    await a.aclose()
    with pytest.raises(ServiceUnavailableError):
        await a.sessions.prompt(s.id, PromptInput(text="#text too late"))
    assert await hosts.store.queries.inbox(s.id) == []
    assert [r.type for r in await hosts.store.read(s.id)] == ["session.created.1"]


@pytest.mark.parametrize("turns", range(6))
async def test_the_lease_scan_ends_when_cancelled_just_as_it_is_rung(
    tmp_path: Path, turns: int
) -> None:
    """A shutdown cancels the scan; a release announced (or a channel back) at
    that moment rings it. The cancellation must win, whatever the interleaving:
    Python 3.11's ``asyncio.wait_for`` returns normally when its awaitable and
    a cancellation land together, and the scan then ran on, so closing the
    runtime waited for it forever."""
    config = RuntimeConfig(data_dir=tmp_path / "data", default_directory=str(tmp_path))
    async with Runtime(config) as runtime:
        [scan] = [t for t in asyncio.all_tasks() if t.get_name() == "lease-scan"]
        async with asyncio.timeout(10):  # past the start-up sweep: waiting to be rung
            for _ in itertools.count():
                if runtime.services.rescan._waiters:  # type: ignore[attr-defined]
                    break
                await asyncio.sleep(0.005)  # a poll, with the deadline above
        runtime.services.rescan.set()
        for _ in range(turns):
            await asyncio.sleep(0)
        scan.cancel()
        done, _ = await asyncio.wait({scan}, timeout=3)
        assert scan in done


async def test_a_lease_scan_the_database_refuses_says_so_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The database away for a while (a restart): each period's failed scan is a
    warning naming the failure, without a traceback, and the scan goes on."""
    from storage import StorageBrokenError

    config = RuntimeConfig(data_dir=tmp_path / "data", default_directory=str(tmp_path))
    async with Runtime(config) as runtime:
        tried = asyncio.Event()

        async def refused() -> None:
            tried.set()
            raise StorageBrokenError("read failed: ConnectionDoesNotExistError")

        monkeypatch.setattr(runtime, "recover", refused)
        for _ in range(2):
            tried.clear()
            runtime.services.rescan.set()
            async with asyncio.timeout(5):
                await tried.wait()
        await asyncio.sleep(0)
    said = [r for r in caplog.records if r.getMessage().startswith("the lease scan failed")]
    assert len(said) >= 2
    assert all(r.levelname == "WARNING" and r.exc_info is None for r in said)
    assert "ConnectionDoesNotExistError" in said[0].getMessage()
