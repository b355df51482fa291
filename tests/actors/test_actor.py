"""The asyncio actor core: mailbox order, ask/tell error policy, lifecycle, registry."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import attrs
import pytest
from loop_turns import quiesce

from actors import Actor, ActorDeadError, ActorError, ActorRef, ActorRegistry
from actors.kit.mailbox import SLICE_S

# --- messages -------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Record:
    value: int


@attrs.frozen(kw_only=True)
class Get:
    pass


@attrs.frozen(kw_only=True)
class Boom:
    error: Exception


@attrs.frozen(kw_only=True)
class Block:
    """Handled by signalling ``entered`` and then waiting for ``gate``."""

    entered: asyncio.Event
    gate: asyncio.Event


@attrs.frozen(kw_only=True)
class WhoDrains:
    """Replies with the task that handles it."""


@attrs.frozen(kw_only=True)
class StopMyself:
    pass


@attrs.frozen(kw_only=True)
class AskMyself:
    pass


@attrs.frozen(kw_only=True)
class AwaitCancelled:
    pass


# --- actors ---------------------------------------------------------------------------------


@attrs.define
class Journal:
    """What the hooks did, shared with the test (the actor object itself stays private)."""

    calls: list[str] = attrs.field(factory=list)
    seen: list[int] = attrs.field(factory=list)
    failures: list[Exception] = attrs.field(factory=list)


class Probe(Actor):
    def __init__(self, journal: Journal, name: str = "probe") -> None:
        self.journal = journal
        self.name = name

    async def on_start(self) -> None:
        self.journal.calls.append(f"{self.name}.start")

    async def on_stop(self) -> None:
        self.journal.calls.append(f"{self.name}.stop")

    async def on_failure(self, exc: Exception) -> None:
        self.journal.failures.append(exc)

    async def on_receive(self, message: object) -> Any:
        match message:
            case Record(value=value):
                self.journal.seen.append(value)
                return None
            case Get():
                return list(self.journal.seen)
            case Boom(error=error):
                raise error
            case Block(entered=entered, gate=gate):
                entered.set()
                await gate.wait()
                self.journal.calls.append(f"{self.name}.unblocked")
                return "unblocked"
            case WhoDrains():
                return asyncio.current_task()
            case StopMyself():
                await self.actor_ref.stop()
                self.journal.calls.append(f"{self.name}.after-stop")
                return None
            case AskMyself():
                return await self.actor_ref.ask(Get())
            case AwaitCancelled():
                cancelled = asyncio.get_running_loop().create_future()
                cancelled.cancel()
                return await cancelled
        return await super().on_receive(message)


class OtherProbe(Probe):
    pass


async def asking(ref: ActorRef[Actor], message: object) -> asyncio.Task[Any]:
    """Start ``ref.ask(message)`` in a task and return once the message is queued."""
    sent = asyncio.Event()

    async def ask() -> Any:
        # ask() queues the message before it first suspends, and the test cannot
        # resume from `sent.wait()` before this task suspends.
        sent.set()
        return await ref.ask(message)

    task = asyncio.create_task(ask())
    await sent.wait()
    return task


@pytest.fixture
def journal() -> Journal:
    return Journal()


# --- tell / ask -----------------------------------------------------------------------------


async def test_told_messages_are_handled_in_order(journal: Journal) -> None:
    ref = await Probe.start(journal)
    for value in range(100):
        ref.tell(Record(value=value))
    # The ask is queued behind every tell, so its reply sees all of them.
    assert await ref.ask(Get()) == list(range(100))
    await ref.stop()


async def test_ask_returns_the_handler_result(journal: Journal) -> None:
    ref = await Probe.start(journal)
    assert await ref.ask(Record(value=1)) is None
    assert await ref.ask(Get()) == [1]
    await ref.stop()


async def test_ask_raises_the_handler_exception_and_the_actor_survives(journal: Journal) -> None:
    ref = await Probe.start(journal)
    error = ValueError("bad input")
    with pytest.raises(ValueError, match="bad input") as raised:
        await ref.ask(Boom(error=error))
    assert raised.value is error
    assert journal.failures == []  # the asker got it; on_failure is for told messages
    assert ref.is_alive()
    assert await ref.ask(Get()) == []
    await ref.stop()


async def test_ask_times_out_and_the_actor_survives(journal: Journal) -> None:
    ref = await Probe.start(journal)
    entered, gate = asyncio.Event(), asyncio.Event()
    with pytest.raises(TimeoutError):
        await ref.ask(Block(entered=entered, gate=gate), timeout=0.01)
    gate.set()
    # The handler was already running when the asker gave up: it finishes regardless.
    assert await ref.ask(Get()) == []
    assert journal.calls == ["probe.start", "probe.unblocked"]
    await ref.stop()


async def test_an_ask_abandoned_while_queued_is_skipped(journal: Journal) -> None:
    ref = await Probe.start(journal)
    entered, gate = asyncio.Event(), asyncio.Event()
    ref.tell(Block(entered=entered, gate=gate))
    with pytest.raises(TimeoutError):
        await ref.ask(Record(value=1), timeout=0.01)
    gate.set()
    assert await ref.ask(Get()) == []
    await ref.stop()


async def test_cancelling_an_asker_does_not_cancel_the_handler(journal: Journal) -> None:
    ref = await Probe.start(journal)
    entered, gate = asyncio.Event(), asyncio.Event()
    asker = await asking(ref, Block(entered=entered, gate=gate))
    await entered.wait()
    asker.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asker
    gate.set()
    assert await ref.ask(Get()) == []
    assert journal.calls == ["probe.start", "probe.unblocked"]
    await ref.stop()


async def test_unhandled_message_type_is_a_type_error(journal: Journal) -> None:
    ref = await Probe.start(journal)
    with pytest.raises(TypeError, match="does not handle 'hello'"):
        await ref.ask("hello")
    await ref.stop()


async def test_a_stray_cancelled_error_is_a_failure_not_a_cancellation(journal: Journal) -> None:
    ref = await Probe.start(journal)
    with pytest.raises(ActorError, match="CancelledError") as raised:
        await ref.ask(AwaitCancelled())
    assert isinstance(raised.value.__cause__, asyncio.CancelledError)
    assert ref.is_alive()
    ref.tell(AwaitCancelled())
    assert await ref.ask(Get()) == []
    assert len(journal.failures) == 1
    await ref.stop()


async def test_asking_yourself_is_refused(journal: Journal) -> None:
    ref = await Probe.start(journal)
    with pytest.raises(RuntimeError, match="asked itself"):
        await ref.ask(AskMyself())
    await ref.stop()


# --- failures -------------------------------------------------------------------------------


async def test_a_told_failure_goes_to_on_failure_and_the_actor_keeps_running(
    journal: Journal,
) -> None:
    ref = await Probe.start(journal)
    error = ValueError("told")
    ref.tell(Boom(error=error))
    ref.tell(Record(value=7))
    assert await ref.ask(Get()) == [7]
    assert journal.failures == [error]
    assert ref.is_alive()
    await ref.stop()


class Plain(Actor):
    async def on_receive(self, message: object) -> Any:
        raise RuntimeError(f"cannot handle {message!r}")


async def test_default_on_failure_logs(caplog: pytest.LogCaptureFixture) -> None:
    ref = await Plain.start()
    ref.tell("x")
    with pytest.raises(RuntimeError):
        await ref.ask("y")  # queued behind "x", so "x" has been handled by now
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "failed to handle a told message" in record.getMessage()
    assert record.exc_info is not None
    await ref.stop()


class BrokenFailureHook(Probe):
    async def on_failure(self, exc: Exception) -> None:
        raise RuntimeError("on_failure is broken")


async def test_a_failing_on_failure_stops_the_actor(
    journal: Journal, caplog: pytest.LogCaptureFixture
) -> None:
    ref = await BrokenFailureHook.start(journal)
    ref.tell(Boom(error=ValueError("first")))
    with pytest.raises(ActorDeadError, match="stopped before handling"):
        await ref.ask(Get())  # queued behind the fatal failure
    assert not ref.is_alive()
    await ref.stop()  # waits for the stop already under way
    assert journal.calls == ["probe.start", "probe.stop"]
    assert ActorRegistry.get_all() == []
    assert any("on_failure raised" in r.getMessage() for r in caplog.records)


# --- lifecycle ------------------------------------------------------------------------------


async def test_on_start_and_on_stop_run_once(journal: Journal) -> None:
    ref = await Probe.start(journal)
    assert journal.calls == ["probe.start"]
    assert ref.is_alive()
    await ref.stop()
    await ref.stop()
    assert journal.calls == ["probe.start", "probe.stop"]
    assert not ref.is_alive()


async def test_concurrent_stops_run_on_stop_once(journal: Journal) -> None:
    ref = await Probe.start(journal)
    await asyncio.gather(ref.stop(), ref.stop(), ref.stop())
    assert journal.calls == ["probe.start", "probe.stop"]


async def test_use_after_stop_raises(journal: Journal) -> None:
    ref = await Probe.start(journal)
    await ref.stop()
    with pytest.raises(ActorDeadError, match="is stopped"):
        ref.tell(Record(value=1))
    with pytest.raises(ActorDeadError, match="is stopped"):
        await ref.ask(Get())
    assert journal.seen == []


async def test_stop_fails_in_flight_and_queued_asks(journal: Journal) -> None:
    ref = await Probe.start(journal)
    entered, gate = asyncio.Event(), asyncio.Event()
    in_flight = await asking(ref, Block(entered=entered, gate=gate))
    await entered.wait()
    queued = [await asking(ref, Record(value=1)), await asking(ref, Get())]
    ref.tell(Record(value=2))

    await ref.stop()

    with pytest.raises(ActorDeadError, match="stopped while handling Block"):
        await in_flight
    for task in queued:
        with pytest.raises(ActorDeadError, match="stopped before handling"):
            await task
    assert journal.seen == []  # nothing after stop was handled
    assert journal.calls == ["probe.start", "probe.stop"]  # the blocked handler was cancelled


async def test_stopping_from_its_own_handler(journal: Journal) -> None:
    ref = await Probe.start(journal)
    with pytest.raises(ActorDeadError, match="stopped while handling StopMyself"):
        await ref.ask(StopMyself())
    await ref.stop()
    # The handler is cancelled at its own stop(): nothing after it runs.
    assert journal.calls == ["probe.start", "probe.stop"]


async def test_an_idle_actor_holds_no_task(journal: Journal) -> None:
    ref = await Probe.start(journal)
    assert asyncio.all_tasks() == {asyncio.current_task()}

    for value in range(3):
        ref.tell(Record(value=value))
    drain = await ref.ask(WhoDrains())
    assert isinstance(drain, asyncio.Task)
    await drain  # the burst is over: the drain task ends on the empty queue
    assert asyncio.all_tasks() == {asyncio.current_task()}
    assert ref.is_alive()

    # The next message starts a new, short-lived task.
    next_drain = await ref.ask(WhoDrains())
    assert next_drain is not drain
    await next_drain
    assert asyncio.all_tasks() == {asyncio.current_task()}
    assert await ref.ask(Get()) == [0, 1, 2]
    await ref.stop()


class FailsToStart(Probe):
    async def on_start(self) -> None:
        self.actor_ref.tell(Record(value=1))
        raise ValueError("no database")


async def test_a_failing_on_start_fails_start(journal: Journal) -> None:
    with pytest.raises(ValueError, match="no database"):
        await FailsToStart.start(journal)
    assert ActorRegistry.get_all() == []
    assert journal.calls == []  # neither on_stop nor the told message ran
    assert journal.seen == []


class GreetsItself(Probe):
    async def on_start(self) -> None:
        await super().on_start()
        self.actor_ref.tell(Record(value=42))


async def test_messages_told_during_on_start_are_handled_after_it(journal: Journal) -> None:
    ref = await GreetsItself.start(journal)
    assert await ref.ask(Get()) == [42]
    await ref.stop()


class StopsDuringStart(Actor):
    async def on_start(self) -> None:
        await self.actor_ref.stop()


async def test_stop_during_on_start_is_refused() -> None:
    with pytest.raises(RuntimeError, match="cannot stop during on_start"):
        await StopsDuringStart.start()
    assert ActorRegistry.get_all() == []


class StopsAgainInOnStop(Probe):
    async def on_stop(self) -> None:
        await self.actor_ref.stop()
        await super().on_stop()


async def test_stop_from_on_stop_returns_at_once(journal: Journal) -> None:
    ref = await StopsAgainInOnStop.start(journal)
    await ref.stop()
    assert journal.calls == ["probe.start", "probe.stop"]


async def test_stop_before_the_drain_task_ever_ran(journal: Journal) -> None:
    ref = await Probe.start(journal)
    ref.tell(Record(value=1))  # spawns a drain task; no await lets it run before stop
    ref.tell(Record(value=2))
    await ref.stop()
    assert journal.seen == []
    assert journal.calls == ["probe.start", "probe.stop"]


def test_loop_shutdown_under_a_busy_actor_leaves_it_dead() -> None:
    journal = Journal()
    refs: list[ActorRef[Probe]] = []

    async def main() -> None:
        ref = await Probe.start(journal)
        refs.append(ref)
        entered = asyncio.Event()
        ref.tell(Block(entered=entered, gate=asyncio.Event()))
        ref.tell(Record(value=1))
        await entered.wait()
        # Returning without stopping: asyncio.run cancels the busy drain task.

    asyncio.run(main())
    [ref] = refs
    assert not ref.is_alive()
    # Not an orderly stop: on_stop does not run and the queued message is dropped.
    assert journal.calls == ["probe.start"]
    assert journal.seen == []


class BrokenStopHook(Probe):
    async def on_stop(self) -> None:
        raise RuntimeError("cannot flush")


async def test_a_failing_on_stop_is_logged_and_the_actor_still_stops(
    journal: Journal, caplog: pytest.LogCaptureFixture
) -> None:
    ref = await BrokenStopHook.start(journal)
    await ref.stop()
    assert not ref.is_alive()
    assert any("on_stop raised" in r.getMessage() for r in caplog.records)


async def test_actor_ref_before_start_is_an_error(journal: Journal) -> None:
    with pytest.raises(RuntimeError, match="no ref before start"):
        _ = Probe(journal).actor_ref


# --- registry -------------------------------------------------------------------------------


async def test_registry_finds_running_actors(journal: Journal) -> None:
    first = await Probe.start(journal, "first")
    second = await OtherProbe.start(journal, "second")
    plain = await Plain.start()

    assert ActorRegistry.get_all() == [first, second, plain]
    assert ActorRegistry.get_by_urn(second.actor_urn) is second
    assert ActorRegistry.get_by_urn("urn:uuid:nobody") is None
    assert ActorRegistry.get_by_class(Probe) == [first, second]  # subclasses included
    assert ActorRegistry.get_by_class(OtherProbe) == [second]

    await first.stop()
    assert ActorRegistry.get_by_urn(first.actor_urn) is None
    assert ActorRegistry.get_all() == [second, plain]
    await ActorRegistry.stop_all()


async def test_stop_all_stops_newest_first(journal: Journal) -> None:
    refs = [await Probe.start(journal, name) for name in ("a", "b", "c")]
    await ActorRegistry.stop_all()
    assert journal.calls[3:] == ["c.stop", "b.stop", "a.stop"]
    assert ActorRegistry.get_all() == []
    assert not any(ref.is_alive() for ref in refs)


async def test_registry_is_not_instantiated() -> None:
    with pytest.raises(TypeError):
        ActorRegistry()


# --- actors made on demand: spawn and on_drained ----------------------------------------------


class Transient(Actor):
    """Stops itself once its mailbox runs dry, unless told to hold on."""

    def __init__(self, journal: Journal, stopped: asyncio.Event | None = None) -> None:
        self.journal = journal
        self.hold = False
        self.stopped = stopped or asyncio.Event()

    def on_drained(self) -> bool:
        self.journal.calls.append("drained")
        return not self.hold

    async def on_stop(self) -> None:
        self.journal.calls.append("stop")
        self.stopped.set()

    async def on_receive(self, message: object) -> Any:
        match message:
            case Record(value=value):
                self.journal.seen.append(value)
                return None
            case Get():
                self.hold = True
                return list(self.journal.seen)
            case Block(entered=entered, gate=gate):
                entered.set()
                await gate.wait()
                return None
        return await super().on_receive(message)


async def test_a_spawned_actor_is_ready_without_an_await(journal: Journal) -> None:
    ref = Transient.spawn(journal)
    assert ref.is_alive()
    assert ActorRegistry.get_by_urn(ref.actor_urn) is ref
    ref.tell(Record(value=1))
    assert journal.seen == []  # handled by its own task, not the caller's
    await ref.stop()


async def test_spawn_refuses_an_actor_with_on_start(journal: Journal) -> None:
    with pytest.raises(TypeError, match="on_start"):
        Probe.spawn(journal)
    assert ActorRegistry.get_by_class(Probe) == []


async def test_an_actor_stops_itself_once_its_queue_runs_dry_and_only_then(
    journal: Journal,
) -> None:
    stopped = asyncio.Event()
    ref = Transient.spawn(journal, stopped)
    entered, gate = asyncio.Event(), asyncio.Event()
    ref.tell(Block(entered=entered, gate=gate))
    await entered.wait()
    ref.tell(Record(value=1))
    ref.tell(Record(value=2))  # queued behind the blocked handler: all are handled
    gate.set()
    await stopped.wait()  # nobody called stop(): it stopped itself
    assert not ref.is_alive()
    await ref.stop()  # and a stop() afterwards is a no-op
    assert journal.seen == [1, 2]
    assert journal.calls == ["drained", "stop"]  # asked once, when empty; stopped once
    with pytest.raises(ActorDeadError):
        ref.tell(Record(value=3))
    assert ActorRegistry.get_by_class(Transient) == []


async def test_a_drained_actor_that_holds_on_keeps_its_messages_coming(journal: Journal) -> None:
    ref = Transient.spawn(journal)
    assert await ref.ask(Get()) == []  # Get makes it hold on
    ref.tell(Record(value=4))
    assert await ref.ask(Get()) == [4]
    assert ref.is_alive()
    assert journal.calls.count("stop") == 0
    await ref.stop()
    assert journal.calls[-1] == "stop"


# --- linger and actors kept out of the registry -----------------------------------------------


class Lingering(Transient):
    """Waits a loop turn once its mailbox is empty before it asks to retire."""

    linger_turns = 1


class Unlisted(Transient):
    registered = False


async def test_a_message_put_within_the_linger_is_handled_by_the_same_actor(
    journal: Journal,
) -> None:
    stopped = asyncio.Event()
    ref = Lingering.spawn(journal, stopped)
    await ref.ask(Record(value=1))
    # The asker is woken before the idle actor's linger ends: it is still here.
    ref.tell(Record(value=2))
    await stopped.wait()
    assert journal.seen == [1, 2]
    assert journal.calls == ["drained", "stop"]  # one drain task: asked to retire once


async def test_a_lingering_actor_retires_once_its_turns_pass_idle(journal: Journal) -> None:
    stopped = asyncio.Event()
    ref = Lingering.spawn(journal, stopped)
    await ref.ask(Record(value=1))
    assert ref.is_alive()  # lingering
    await quiesce(Lingering.linger_turns + 1)
    assert not ref.is_alive()
    assert stopped.is_set()
    assert journal.calls == ["drained", "stop"]
    with pytest.raises(ActorDeadError):
        ref.tell(Record(value=2))


async def test_a_lingering_actor_stops_at_once_when_stopped(journal: Journal) -> None:
    ref = Lingering.spawn(journal)
    await ref.ask(Record(value=1))
    await ref.stop()  # cancels the linger: no drained question, on_stop once
    assert journal.calls == ["stop"]
    assert not ref.is_alive()


async def test_an_unregistered_actor_is_not_listed_and_still_stops(journal: Journal) -> None:
    stopped = asyncio.Event()
    ref = Unlisted.spawn(journal, stopped)
    assert ActorRegistry.get_all() == []
    assert ActorRegistry.get_by_urn(ref.actor_urn) is None
    assert ref.actor_urn.startswith("urn:sessionrt:actor:")
    ref.tell(Record(value=1))
    await stopped.wait()  # retired when drained, as a registered one does
    assert journal.seen == [1]
    assert not ref.is_alive()


# --- fairness -------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Burn:
    cpu_s: float


class Burner(Actor):
    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    async def on_receive(self, message: object) -> Any:
        match message:
            case Burn(cpu_s=cpu_s):
                until = time.thread_time() + cpu_s
                while time.thread_time() < until:
                    pass
                self.journal.seen.append(len(self.journal.seen))
                return None
            case Get():
                return list(self.journal.seen)
        return await super().on_receive(message)


async def test_a_backlog_of_handlers_that_never_suspend_lets_the_loop_run_between() -> None:
    """Twenty handlers of 1 ms CPU each, none suspending, used to run in one callback
    (20 ms with the loop held); the drain yields once its slice is used up."""
    journal = Journal()
    ref = await Burner.start(journal)
    for _ in range(20):
        ref.tell(Burn(cpu_s=0.001))
    handled_when_the_loop_ran: list[int] = []
    asyncio.get_running_loop().call_soon(
        lambda: handled_when_the_loop_ran.append(len(journal.seen))
    )
    await ref.ask(Get())  # queued behind the burns: answered after all of them
    per_slice = int(SLICE_S / 0.001) + 1  # the slice may end a handler late
    assert 1 <= handled_when_the_loop_ran[0] <= per_slice
    assert journal.seen == list(range(20))  # in order, all of them
    await ref.stop()
