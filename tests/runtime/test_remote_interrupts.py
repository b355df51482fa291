"""An interrupt for a session another host runs arrives, is answered, and acts once.

Two runtimes on one real SQLite store and an in-process bus that loses or holds
the messages a test names, as a connection being re-made would
(:mod:`actors.session.interrupts`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from hosts import Hosts, RecordingBus
from manual_clock import ManualClock

from actors.host_messages import HostMessage, LocalHostBus
from actors.runtime import Runtime
from actors.session.interrupts import WAIT_S
from protocol.errors import ServiceUnavailableError
from protocol.requests import CreateSessionInput, PromptInput
from storage import SQLiteStore

SLEEP = '#tool bash {"command": "sleep 30"}'

Rule = Callable[[str | None, HostMessage], bool]


class LossyBus(RecordingBus):
    """The in-process bus; ``drop`` rules lose a message, ``hold`` rules delay it
    until :attr:`release` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.drop: list[Rule] = []
        self.hold: list[Rule] = []
        self.held = asyncio.Event()
        self.release = asyncio.Event()
        self.published = asyncio.Event()

    async def publish(self, host_id: str | None, message: HostMessage) -> None:
        self.sent.append((host_id, message))  # lost or not
        self.published.set()
        for rule in list(self.drop):
            if rule(host_id, message):
                self.drop.remove(rule)
                return
        for rule in list(self.hold):
            if rule(host_id, message):
                self.hold.remove(rule)
                self.held.set()
                await self.release.wait()
        await LocalHostBus.publish(self, host_id, message)

    async def until_sent(self, kind: str) -> None:
        """Return once a message of ``kind`` has been published (lost or not)."""
        await self.until_sent_count(kind, 1)

    async def until_sent_count(self, kind: str, count: int) -> None:
        """Return once ``count`` messages of ``kind`` have been published (lost or not)."""
        async with asyncio.timeout(10):
            while len(self.kinds(kind)) < count:
                self.published.clear()
                await self.published.wait()


class Two(Hosts):
    bus: LossyBus  # what the fixture gives it


@pytest.fixture
async def two(tmp_path: Path) -> AsyncIterator[Two]:
    async with SQLiteStore(tmp_path / "shared.sqlite") as store:
        t = Two(tmp_path, store, LossyBus())
        async with t.stack:
            yield t
        t.events.close()


@pytest.fixture
async def clocked(tmp_path: Path) -> AsyncIterator[tuple[Two, ManualClock]]:
    """Two hosts whose waits (and leases) are on a clock only the test moves."""
    clock = ManualClock()
    async with SQLiteStore(tmp_path / "shared.sqlite", clock=clock) as store:
        t = Two(tmp_path, store, LossyBus())
        async with t.stack:
            yield t, clock
        t.events.close()


async def _resent_after(two: Two, clock: ManualClock, sent: int, due: int) -> None:
    """``sent`` interrupts went out and the next waits for ``due``: not a millisecond
    before it does another go out, and at it one does."""
    await clock.until_waiting(due)
    assert len(two.bus.kinds("interrupt")) == sent
    clock.advance(due - 1 - clock.now_ms())
    assert due in clock.waits()  # the pause has not ended
    await two.store.queries.claims()  # a round trip: the loop ran what the advance woke
    assert len(two.bus.kinds("interrupt")) == sent  # and no resend went out
    clock.advance(1)
    await two.bus.until_sent_count("interrupt", sent + 1)


def _to_a(kind: str) -> Rule:
    return lambda host, m: host == "host-a" and m.kind == kind


def _to_b(kind: str) -> Rule:
    return lambda host, m: host == "host-b" and m.kind == kind


async def _running_on_a(two: Two) -> tuple[Runtime, Runtime, str]:
    a, b = await two.start("host-a"), await two.start("host-b")
    s = await a.sessions.create()
    await a.sessions.prompt(s.id, PromptInput(text=SLEEP))
    await two.feed.wait("session.tool.called", sessionID=s.id)
    return a, b, s.id


async def test_a_lost_interrupt_is_sent_again_until_the_owner_answers(
    clocked: tuple[Two, ManualClock],
) -> None:
    """Resent after 250 ms, then 500 ms more, on the hosts' clock: never earlier."""
    two, clock = clocked
    a, b, sid = await _running_on_a(two)
    two.bus.drop += [_to_a("interrupt"), _to_a("interrupt")]  # the first two are lost
    asking = asyncio.create_task(b.interrupt(sid))
    await two.bus.until_sent("interrupt")
    start = clock.now_ms()
    await _resent_after(two, clock, 1, start + 250)
    await _resent_after(two, clock, 2, start + 750)
    assert await asking is True
    done = await two.feed.wait("session.execution.interrupted", sessionID=sid)
    assert done["data"]["reason"] == "user"
    requests = two.bus.kinds("interrupt")
    assert len(requests) == 3
    assert len({m.request for m in requests}) == 1
    assert requests[0].request
    assert [m.answer for m in two.bus.kinds("answer")] == [True]
    await a.execution.wait_idle(sid)


async def test_a_request_seen_again_gets_the_same_answer_and_stops_nothing_new(two: Two) -> None:
    a, b, sid = await _running_on_a(two)
    # A's answer is lost, and B's resend is held back until a new execution runs on A.
    two.bus.drop.append(_to_b("answer"))
    first = True

    def second_request(host: str | None, m: HostMessage) -> bool:
        nonlocal first
        if host == "host-a" and m.kind == "interrupt":
            if first:
                first = False
                return False
            return True
        return False

    two.bus.hold.append(second_request)
    asking = asyncio.create_task(b.interrupt(sid))
    await two.feed.wait("session.execution.interrupted", sessionID=sid)
    await a.execution.wait_idle(sid)
    await asyncio.wait_for(two.bus.held.wait(), 5)
    mark = len(two.feed.events)
    await a.sessions.prompt(sid, PromptInput(text=SLEEP))  # the next execution, on A
    await two.feed.wait("session.tool.called", sessionID=sid, after=mark)
    two.bus.release.set()
    assert await asyncio.wait_for(asking, 10) is True
    # A answers after handling a message: the resend was handled, and did not stop it.
    assert [m.answer for m in two.bus.kinds("answer")] == [True, True]
    assert sid in await a.execution.active()
    assert (await two.types(sid)).count("session.execution.interrupted.1") == 1
    assert await a.interrupt(sid) is True


async def test_an_owner_that_never_answers_is_a_503_not_a_yes(
    clocked: tuple[Two, ManualClock],
) -> None:
    """Resent at 0.25, 0.75, then every second, and given up at WAIT_S on the clock."""
    two, clock = clocked
    a, b, sid = await _running_on_a(two)
    two.bus.drop += [_to_a("interrupt")] * 50
    asking = asyncio.create_task(b.interrupt(sid))
    await two.bus.until_sent("interrupt")
    start = clock.now_ms()
    deadline = start + int(WAIT_S * 1000)
    await clock.until_waiting(deadline)
    resends = [250, 750, *range(1750, int(WAIT_S * 1000), 1000)]
    for sent, at in enumerate(resends, 1):
        await _resent_after(two, clock, sent, start + at)
    await clock.until_waiting(start + resends[-1] + 1000)  # the next pause, past the deadline
    clock.advance(deadline - 1 - clock.now_ms())
    assert deadline in clock.waits()
    assert not asking.done()
    clock.advance(1)
    with pytest.raises(ServiceUnavailableError, match=r"host-a.*did not answer"):
        await asking
    assert len(two.bus.kinds("interrupt")) == len(resends) + 1  # tried again until the end
    assert sid in await a.execution.active()
    assert b.services.remote_interrupts.waiting == 0
    assert await a.interrupt(sid) is True


async def test_an_interrupt_outlives_a_stalled_owner_and_stops_the_host_that_took_over(
    two: Two,
) -> None:
    """A stops renewing and hears nothing (as a SIGSTOPped host); B's scan takes the
    session over and runs the continuation: that is what the interrupt stops."""
    a, b = await two.start("host-a", ttl_ms=400), await two.start("host-b", ttl_ms=400)
    s = await a.sessions.create(CreateSessionInput(metadata={"script": SLEEP}))
    await a.sessions.prompt(s.id, PromptInput(text="go"))
    await two.feed.wait("session.tool.called", sessionID=s.id)
    two.bus.drop += [_to_a("interrupt")] * 100
    a.leases.suspend()
    asking = asyncio.create_task(b.interrupt(s.id))
    await two.feed.wait("session.execution.recovering", sessionID=s.id)
    assert await asyncio.wait_for(asking, 10) is True
    done = await two.feed.wait("session.execution.interrupted", sessionID=s.id)
    assert done["data"]["reason"] == "user"
    await b.execution.wait_idle(s.id)
    rows = await two.store.fetch(
        "SELECT f.host_id FROM event_fence f JOIN event e ON e.position = f.position"
        " WHERE e.aggregate_id = ? AND e.type = 'session.execution.interrupted.1'",
        (s.id,),
    )
    assert rows == [("host-b",)]  # B's own execution, stopped by B
    a.leases.suspend(False)


async def test_an_interrupt_for_a_session_that_stopped_running_meanwhile_is_a_no(
    two: Two,
) -> None:
    a, b, sid = await _running_on_a(two)
    two.bus.drop += [_to_a("interrupt")] * 100  # A never hears it...
    asking = asyncio.create_task(b.interrupt(sid))
    await two.bus.until_sent("interrupt")
    assert await a.interrupt(sid) is True  # ...and stops on its own account
    assert await asyncio.wait_for(asking, 10) is False  # nothing runs: no, not a 503


async def test_a_message_with_a_request_id_round_trips_and_a_bad_one_is_refused() -> None:
    m = HostMessage(
        kind="answer", origin="host-a", session_ids=("ses_1",), request="ab12", answer=True
    )
    assert HostMessage.decode(m.encode()) == m
    old = '{"kind": "interrupt", "origin": "h", "sessions": ["ses_1"], "scope": "input"}'
    assert HostMessage.decode(old).request == ""
    with pytest.raises(TypeError):
        HostMessage.decode(old[:-1] + ', "request": 5}')
