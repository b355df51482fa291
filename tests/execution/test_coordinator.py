"""The execution coordinator's rules, one by one (opencode-v2.md §4.3 / §5.1).

Drains are fakes that block on futures the test controls, so every
interleaving is forced by the test, never by timing.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator

import attrs
import pytest
from loop_turns import quiesce

from actors import ActorRegistry
from actors.session import Own, SessionActor, Terminal
from actors.session.inbox import Scope
from actors.session.messages import Interrupt
from actors.supervisor import Execution


@attrs.define
class DrainCall:
    session_id: str
    scope: Scope
    force: bool
    release: asyncio.Future[None]


class Hooks:
    def __init__(self) -> None:
        self.log: list[tuple[object, ...]] = []
        self.drains: asyncio.Queue[DrainCall] = asyncio.Queue()
        self.settle_gate: asyncio.Future[None] | None = None
        self.settling = asyncio.Event()
        self.start_gate: asyncio.Future[None] | None = None
        self.starting = asyncio.Event()

    async def started(self, session_id: str) -> None:
        self.starting.set()
        if self.start_gate is not None:
            await self.start_gate
        self.log.append(("started", session_id))

    async def drain(self, session_id: str, scope: Scope, force: bool, own: Own) -> None:
        self.log.append(("drain", session_id, scope, force))
        call = DrainCall(session_id, scope, force, asyncio.get_running_loop().create_future())
        self.drains.put_nowait(call)
        await call.release

    async def settled(self, session_id: str, terminal: Terminal) -> None:
        self.settling.set()
        if self.settle_gate is not None:
            await self.settle_gate
        self.log.append(("settled", session_id, terminal))

    def kinds(self) -> list[object]:
        return [entry[0] for entry in self.log]

    def scopes(self) -> list[tuple[Scope, bool]]:
        return [(e[2], e[3]) for e in self.log if e[0] == "drain"]  # type: ignore[misc]


@pytest.fixture
async def hooks() -> Hooks:
    return Hooks()


@pytest.fixture
async def execution(hooks: Hooks) -> AsyncIterator[Execution]:
    ex = await Execution.start(hooks)
    yield ex
    await ex.shutdown()


async def next_drain(hooks: Hooks) -> DrainCall:
    return await asyncio.wait_for(hooks.drains.get(), 5)


OK = Terminal(kind="succeeded")


async def delivered(execution: Execution) -> None:
    """Wait until every wake told so far has been handled by its session actor.

    Wakes are tells through the supervisor's mailbox and then the session's.
    The supervisor answers ``active`` after forwarding every earlier wake, and
    the session actor's drain task, started when the wake was forwarded, runs
    before the asker's task is woken by that answer (the loop runs ready
    callbacks in order): its handling of a wake never awaits.
    """
    await execution.active()


async def test_starts_execution_when_woken_while_idle(execution: Execution, hooks: Hooks) -> None:
    execution.wake("ses_a")
    call = await next_drain(hooks)
    assert (call.scope, call.force) == ("input", False)
    assert await execution.active() == ["ses_a"]
    call.release.set_result(None)
    await execution.wait_idle("ses_a")
    assert hooks.log == [
        ("started", "ses_a"),
        ("drain", "ses_a", "input", False),
        ("settled", "ses_a", OK),
    ]
    assert await execution.active() == []


async def test_coalesces_wakes_received_during_a_drain(execution: Execution, hooks: Hooks) -> None:
    execution.wake("ses_a")
    first = await next_drain(hooks)
    for _ in range(3):
        execution.wake("ses_a")
    await delivered(execution)
    first.release.set_result(None)
    second = await next_drain(hooks)
    second.release.set_result(None)
    await execution.wait_idle("ses_a")
    assert hooks.kinds() == ["started", "drain", "drain", "settled"]


async def test_runs_again_when_woken_during_the_follow_up(
    execution: Execution, hooks: Hooks
) -> None:
    execution.wake("ses_a")
    first = await next_drain(hooks)
    execution.wake("ses_a")
    await delivered(execution)
    first.release.set_result(None)
    second = await next_drain(hooks)
    execution.wake("ses_a")
    await delivered(execution)
    second.release.set_result(None)
    (await next_drain(hooks)).release.set_result(None)
    await execution.wait_idle("ses_a")
    assert hooks.kinds() == ["started", "drain", "drain", "drain", "settled"]


async def test_input_scope_wins_when_coalescing(execution: Execution, hooks: Hooks) -> None:
    execution.wake("ses_a", "steer")
    first = await next_drain(hooks)
    execution.wake("ses_a", "steer")
    execution.wake("ses_a", "input")
    execution.wake("ses_a", "steer")
    await delivered(execution)
    first.release.set_result(None)
    (await next_drain(hooks)).release.set_result(None)
    await execution.wait_idle("ses_a")
    assert hooks.scopes() == [("steer", False), ("input", False)]


async def test_a_consumed_input_scope_is_not_carried_into_a_steer_drain(
    execution: Execution, hooks: Hooks
) -> None:
    execution.wake("ses_a", "input")
    first = await next_drain(hooks)
    execution.wake("ses_a", "input")
    await delivered(execution)
    first.release.set_result(None)
    second = await next_drain(hooks)
    execution.wake("ses_a", "steer")
    await delivered(execution)
    second.release.set_result(None)
    (await next_drain(hooks)).release.set_result(None)
    await execution.wait_idle("ses_a")
    assert hooks.scopes() == [("input", False), ("input", False), ("steer", False)]


async def test_concurrent_resumes_join_one_drain(execution: Execution, hooks: Hooks) -> None:
    waiters = [asyncio.ensure_future(execution.resume("ses_a")) for _ in range(5)]
    call = await next_drain(hooks)
    assert call.force is True
    call.release.set_result(None)
    assert await asyncio.gather(*waiters) == [OK] * 5
    assert hooks.kinds() == ["started", "drain", "settled"]


async def test_resume_joins_a_wake_started_execution_without_forcing(
    execution: Execution, hooks: Hooks
) -> None:
    execution.wake("ses_a")
    call = await next_drain(hooks)
    waiter = asyncio.ensure_future(execution.resume("ses_a"))
    await delivered(execution)
    call.release.set_result(None)
    assert await waiter == OK
    assert hooks.scopes() == [("input", False)]


async def test_interrupting_a_joined_waiter_does_not_cancel_the_execution(
    execution: Execution, hooks: Hooks
) -> None:
    impatient = asyncio.ensure_future(execution.resume("ses_a"))
    patient = asyncio.ensure_future(execution.resume("ses_a"))
    call = await next_drain(hooks)
    impatient.cancel()
    with pytest.raises(asyncio.CancelledError):
        await impatient
    assert not call.release.done()
    call.release.set_result(None)
    assert await patient == OK


async def test_interrupt_while_idle_is_a_no_op(execution: Execution, hooks: Hooks) -> None:
    assert await execution.interrupt("ses_a") is False
    assert hooks.log == []


async def test_interrupt_answers_before_cleanup_and_clears_the_doorbell(
    execution: Execution, hooks: Hooks
) -> None:
    hooks.settle_gate = asyncio.get_running_loop().create_future()
    waiter = asyncio.ensure_future(execution.resume("ses_a"))
    await next_drain(hooks)
    execution.wake("ses_a")  # belongs to the intent being cancelled
    await delivered(execution)
    assert await execution.interrupt("ses_a") is True
    await hooks.settling.wait()
    # Acknowledged while settlement is still blocked; the waiter is not told yet.
    assert not waiter.done()
    assert await execution.interrupt("ses_a") is False  # repeated: a no-op
    hooks.settle_gate.set_result(None)
    assert await waiter == Terminal(kind="interrupted", reason="user")
    await execution.wait_idle("ses_a")
    assert hooks.kinds() == ["started", "drain", "settled"]  # no successor


async def test_an_interrupt_while_the_terminal_is_recorded_is_a_no_op_and_keeps_the_follow_up(
    execution: Execution, hooks: Hooks
) -> None:
    """Settled is a no-op (the contract): the answer is False, so the wake rung
    during the drain must still start its successor, or the input it was rung
    for would wait for a wake that never comes."""
    hooks.settle_gate = asyncio.get_running_loop().create_future()
    execution.wake("ses_a")
    (await next_drain(hooks)).release.set_result(None)
    await hooks.settling.wait()
    execution.wake("ses_a")  # a prompt admitted while the terminal is recorded
    await delivered(execution)
    assert await execution.interrupt("ses_a") is False
    hooks.settle_gate.set_result(None)
    successor = await next_drain(hooks)
    assert (successor.scope, successor.force) == ("input", False)
    successor.release.set_result(None)
    await execution.wait_idle("ses_a")
    assert hooks.kinds() == ["started", "drain", "settled", "started", "drain", "settled"]


async def test_an_interrupt_while_the_start_is_recorded_waits_for_it_and_runs_no_drain(
    execution: Execution, hooks: Hooks
) -> None:
    """The start lands whole (it carries the claim); the interrupt takes effect
    right after it, before any drain."""
    hooks.start_gate = asyncio.get_running_loop().create_future()
    waiter = asyncio.ensure_future(execution.resume("ses_a"))
    await hooks.starting.wait()
    assert await execution.interrupt("ses_a") is True
    assert await execution.interrupt("ses_a") is False  # already stopping
    await quiesce()
    assert hooks.log == []  # the start is not cut short
    hooks.start_gate.set_result(None)
    assert await waiter == Terminal(kind="interrupted", reason="user")
    assert hooks.kinds() == ["started", "settled"]


async def test_a_shutdown_while_the_start_or_the_terminal_is_recorded_lets_it_land(
    hooks: Hooks,
) -> None:
    execution = await Execution.start(hooks)
    hooks.start_gate = asyncio.get_running_loop().create_future()
    execution.wake("ses_a")
    await hooks.starting.wait()
    stopping = asyncio.ensure_future(execution.shutdown())
    await quiesce()
    assert not stopping.done()
    hooks.start_gate.set_result(None)
    await stopping
    assert hooks.log == [
        ("started", "ses_a"),
        ("settled", "ses_a", Terminal(kind="interrupted", reason="shutdown")),
    ]
    # The terminal: a teardown while it is recorded waits for it.
    hooks2 = Hooks()
    hooks2.settle_gate = asyncio.get_running_loop().create_future()
    execution = await Execution.start(hooks2)
    execution.wake("ses_b")
    (await next_drain(hooks2)).release.set_result(None)
    await hooks2.settling.wait()
    stopping = asyncio.ensure_future(execution.shutdown())
    await quiesce()
    assert not stopping.done()
    hooks2.settle_gate.set_result(None)
    await stopping
    assert hooks2.log[-1] == ("settled", "ses_b", OK)
    assert ActorRegistry.get_all() == []


async def test_a_wake_during_interrupt_cleanup_starts_a_successor_with_its_scope(
    execution: Execution, hooks: Hooks
) -> None:
    hooks.settle_gate = asyncio.get_running_loop().create_future()
    execution.wake("ses_a")
    await next_drain(hooks)
    assert await execution.interrupt("ses_a") is True
    await hooks.settling.wait()
    execution.wake("ses_a", "steer")
    await delivered(execution)
    hooks.settle_gate.set_result(None)
    successor = await next_drain(hooks)
    assert (successor.scope, successor.force) == ("steer", False)
    successor.release.set_result(None)
    await execution.wait_idle("ses_a")
    assert hooks.kinds() == ["started", "drain", "settled", "started", "drain", "settled"]


async def test_a_resume_during_interrupt_cleanup_starts_a_forced_successor(
    execution: Execution, hooks: Hooks
) -> None:
    hooks.settle_gate = asyncio.get_running_loop().create_future()
    first_waiter = asyncio.ensure_future(execution.resume("ses_a"))
    await next_drain(hooks)
    assert await execution.interrupt("ses_a") is True
    await hooks.settling.wait()
    second_waiter = asyncio.ensure_future(execution.resume("ses_a"))
    await delivered(execution)
    hooks.settle_gate.set_result(None)
    successor = await next_drain(hooks)
    successor.release.set_result(None)
    assert await first_waiter == Terminal(kind="interrupted", reason="user")
    assert await second_waiter == OK
    assert hooks.scopes() == [("input", True), ("input", True)]


async def test_a_wake_racing_a_failure_starts_one_follow_up(
    execution: Execution, hooks: Hooks
) -> None:
    waiter = asyncio.ensure_future(execution.resume("ses_a"))
    call = await next_drain(hooks)
    execution.wake("ses_a")
    await delivered(execution)
    boom = RuntimeError("drain exploded")
    call.release.set_exception(boom)
    terminal = await waiter
    assert terminal.kind == "failed"
    assert terminal.error is not None
    assert terminal.error.message == "drain exploded"
    (await next_drain(hooks)).release.set_result(None)
    await execution.wait_idle("ses_a")
    assert hooks.kinds() == ["started", "drain", "settled", "started", "drain", "settled"]


async def test_different_sessions_run_concurrently(execution: Execution, hooks: Hooks) -> None:
    execution.wake("ses_a")
    execution.wake("ses_b")
    first, second = await next_drain(hooks), await next_drain(hooks)
    assert {first.session_id, second.session_id} == {"ses_a", "ses_b"}
    assert sorted(await execution.active()) == ["ses_a", "ses_b"]
    first.release.set_result(None)
    second.release.set_result(None)
    await execution.wait_idle("ses_a")
    await execution.wait_idle("ses_b")
    assert await execution.active() == []


async def test_settles_once_per_busy_period_and_retires_idle_actors(
    execution: Execution, hooks: Hooks
) -> None:
    execution.wake("ses_a")
    first = await next_drain(hooks)
    execution.wake("ses_a")
    await delivered(execution)
    first.release.set_result(None)
    (await next_drain(hooks)).release.set_result(None)
    await execution.wait_idle("ses_a")
    assert hooks.kinds().count("started") == 1
    assert hooks.kinds().count("settled") == 1
    for _ in range(20):  # the retirement travels through two mailboxes
        if not execution.session_actors():
            break
        await asyncio.sleep(0)
    assert execution.session_actors() == []


async def test_an_actor_woken_while_its_idle_notice_travels_is_not_retired(
    execution: Execution, hooks: Hooks
) -> None:
    """The wake reaches the supervisor just before the actor's "idle" does, and
    the actor just after it said so: it is busy again, and must not be stopped."""
    settled = hooks.settled
    woke: list[bool] = []

    async def settled_then_wake(session_id: str, terminal: Terminal) -> None:
        await settled(session_id, terminal)
        if not woke:
            woke.append(True)
            execution.wake(session_id)  # told before the actor tells it is idle

    hooks.settled = settled_then_wake  # type: ignore[method-assign]
    execution.wake("ses_a")
    (await next_drain(hooks)).release.set_result(None)
    (await next_drain(hooks)).release.set_result(None)
    await execution.wait_idle("ses_a")
    assert [e for e in hooks.log if e[0] == "settled"] == [("settled", "ses_a", OK)] * 2
    for _ in range(20):
        if not execution.session_actors():
            break
        await asyncio.sleep(0)
    assert execution.session_actors() == []


async def test_shutdown_interrupts_with_reason_shutdown(hooks: Hooks) -> None:
    execution = await Execution.start(hooks)
    execution.wake("ses_a")
    await next_drain(hooks)
    await execution.shutdown()
    assert hooks.log[-1] == ("settled", "ses_a", Terminal(kind="interrupted", reason="shutdown"))
    execution.wake("ses_a")  # after shutdown: ignored, not an error
    assert ActorRegistry.get_all() == []


def stack_depth() -> int:
    frame, depth = inspect.currentframe(), 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1
    return depth


class SelfWaking:
    def __init__(self, execution: list[Execution], limit: int) -> None:
        self.execution = execution
        self.limit = limit
        self.count = 0
        self.starts = 0
        self.settles = 0
        self.depths: set[int] = set()

    async def started(self, session_id: str) -> None:
        self.starts += 1

    async def drain(self, session_id: str, scope: Scope, force: bool, own: Own) -> None:
        self.count += 1
        self.depths.add(stack_depth())
        if self.count < self.limit:
            self.execution[0].wake(session_id)
            await delivered(self.execution[0])  # rung during this drain

    async def settled(self, session_id: str, terminal: Terminal) -> None:
        self.settles += 1


async def test_self_waking_drains_keep_a_flat_stack() -> None:
    holder: list[Execution] = []
    hooks = SelfWaking(holder, limit=20_000)
    execution = await Execution.start(hooks)
    holder.append(execution)
    execution.wake("ses_loop")
    await execution.wait_idle("ses_loop")
    await execution.shutdown()
    assert hooks.count == 20_000
    assert (hooks.starts, hooks.settles) == (1, 1)  # one busy period throughout
    assert len(hooks.depths) == 1


# -- the supervisor answers from its own books ---------------------------------------------------


async def retired(execution: Execution, count: int = 50) -> None:
    """Let told Retire messages run (a stop takes a few loop turns); the guard is a count."""
    for _ in range(count):
        if not execution.session_actors():
            return
        await asyncio.sleep(0)


async def test_active_holds_every_session_from_its_wake_until_it_is_idle(
    execution: Execution, hooks: Hooks
) -> None:
    sessions = [f"ses_{n:02d}" for n in range(30)]
    for sid in sessions:
        execution.wake(sid)
    # No barrier: a wake the supervisor has forwarded counts before its actor handles it.
    assert await execution.active() == sessions
    calls = [await next_drain(hooks) for _ in sessions]
    for call in calls[::2]:
        call.release.set_result(None)
    await asyncio.gather(*(execution.wait_idle(c.session_id) for c in calls[::2]))
    assert await execution.active() == [c.session_id for c in calls[1::2]]
    for call in calls[1::2]:
        call.release.set_result(None)
    await asyncio.gather(*(execution.wait_idle(sid) for sid in sessions))
    assert await execution.active() == []
    await retired(execution)
    assert execution.session_actors() == []


async def test_wait_idle_does_not_return_between_a_busy_period_and_its_successor(
    execution: Execution, hooks: Hooks
) -> None:
    hooks.settle_gate = asyncio.get_running_loop().create_future()
    execution.wake("ses_a")
    await next_drain(hooks)
    idle = asyncio.ensure_future(execution.wait_idle("ses_a"))
    assert await execution.interrupt("ses_a") is True
    await hooks.settling.wait()
    execution.wake("ses_a")  # during cleanup: a successor starts at settlement
    await delivered(execution)
    hooks.settle_gate.set_result(None)
    successor = await next_drain(hooks)
    # The first period has settled; the successor runs: still not idle.
    assert hooks.kinds() == ["started", "drain", "settled", "started", "drain"]
    assert not idle.done()
    successor.release.set_result(None)
    await idle
    assert await execution.active() == []


async def test_an_interrupt_racing_the_idle_report_is_answered_and_the_actor_retired(
    execution: Execution, hooks: Hooks
) -> None:
    execution.wake("ses_a")
    (await next_drain(hooks)).release.set_result(None)
    await hooks.settling.wait()
    # Settled, its Idle report possibly still on its way: the interrupt may be
    # forwarded to an idle actor, which answers False and reports idle again.
    assert await execution.interrupt("ses_a") is False
    execution.lease_lost("ses_a")
    await execution.wait_idle("ses_a")
    await retired(execution)
    assert execution.session_actors() == []
    # A later wake gets a fresh actor.
    execution.wake("ses_a")
    (await next_drain(hooks)).release.set_result(None)
    await execution.wait_idle("ses_a")
    assert hooks.kinds() == ["started", "drain", "settled"] * 2


async def test_shutdown_is_answered_once_every_busy_period_settled_and_refuses_new_work(
    hooks: Hooks,
) -> None:
    execution = await Execution.start(hooks)
    hooks.settle_gate = asyncio.get_running_loop().create_future()
    execution.wake("ses_a")
    execution.wake("ses_b")
    await next_drain(hooks)
    await next_drain(hooks)
    stopping = asyncio.ensure_future(execution.shutdown())
    await hooks.settling.wait()
    # Settlement is held; the supervisor is not blocked on it and still answers.
    assert await execution.active() == ["ses_a", "ses_b"]
    assert await execution.resume("ses_c") == Terminal(kind="interrupted", reason="shutdown")
    execution.wake("ses_c")  # closed: ignored
    assert await execution.interrupt("ses_c") is False
    assert not stopping.done()
    hooks.settle_gate.set_result(None)
    await stopping
    shutdown = Terminal(kind="interrupted", reason="shutdown")
    assert sorted(e[1:] for e in hooks.log if e[0] == "settled") == [  # type: ignore[type-var]
        ("ses_a", shutdown),
        ("ses_b", shutdown),
    ]
    assert ActorRegistry.get_all() == []


async def test_a_resumer_that_gives_up_leaves_the_others_their_answer(
    execution: Execution, hooks: Hooks
) -> None:
    waiters = [asyncio.ensure_future(execution.resume("ses_a")) for _ in range(3)]
    call = await next_drain(hooks)
    waiters[1].cancel()
    call.release.set_result(None)
    assert await waiters[0] == OK
    assert await waiters[2] == OK
    assert waiters[1].cancelled()


async def test_an_interrupt_right_after_the_wake_still_settles_the_busy_period(
    execution: Execution, hooks: Hooks
) -> None:
    """The actor handles the wake (its busy task is created, not yet run) and the
    interrupt in one pass: a task cancelled before its first step never runs its
    body, so the busy period must not be cancelled that way (it never settled,
    and shutdown waited for it forever)."""
    reply: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    # Both told before the supervisor runs: it forwards them in one pass, and the
    # session actor handles both before its new busy task first runs.
    execution.wake("ses_a")
    execution._supervisor.tell(Interrupt(session_id="ses_a", reason="user", reply=reply))
    async with asyncio.timeout(10):  # the bug this guards against waited forever
        await execution.wait_idle("ses_a")
    assert await reply is True
    assert hooks.kinds() == ["started", "settled"]  # cancelled before its first drain
    assert hooks.log[-1] == ("settled", "ses_a", Terminal(kind="interrupted", reason="user"))
    await execution.shutdown()


# -- session actors: kept in the supervisor's directory, lingering a turn -----------------------


async def test_a_command_right_after_another_finds_the_same_actor_then_it_retires(
    execution: Execution,
) -> None:
    async def me(actor: SessionActor) -> SessionActor:
        return actor

    first = await execution.command("ses_a", me)
    second = await execution.command("ses_a", me)  # sent as soon as the first answered
    assert first is second
    assert execution.session_actors() == [first.actor_ref]
    await quiesce(SessionActor.linger_turns + 1)
    assert execution.session_actors() == []  # idle: retired, bounded by its turns
    third = await execution.command("ses_a", me)
    assert third is not first


async def test_session_actors_are_not_in_the_registry_and_stop_with_the_supervisor(
    hooks: Hooks,
) -> None:
    execution = await Execution.start(hooks)
    execution.wake("ses_a")
    await next_drain(hooks)
    [ref] = execution.session_actors()
    assert ActorRegistry.get_by_class(SessionActor) == []
    await ActorRegistry.stop_all()  # reaches the session actor through its supervisor
    assert not ref.is_alive()
    assert execution.session_actors() == []
    assert hooks.log[-1] == ("settled", "ses_a", Terminal(kind="interrupted", reason="shutdown"))
