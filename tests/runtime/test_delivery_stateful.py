"""Random command sequences against one session: the delivery rules hold after each settle.

A hypothesis state machine drives a real runtime (SQLite file, scripted
model, real shells) with prompts (steer/queue, one of them a turn that calls
a tool), synthetic input, manual compactions, moves, cancels, delivery
changes, interrupts, resumes, revert stage/clear/commit and user shells,
without waiting between them. A ``settle`` rule waits only for what the
runtime does by itself (the shells end, the resumes return, the session goes
idle: no doorbell of its own), then checks:

- nothing is left pending that a wake the runtime rang should have delivered
  (:func:`owed`): a missed wake is a session that never delivers again;
- every promotion in the log followed the contract's order when it happened
  (:func:`_check_batch`): the steers ahead of the first control item deliver
  together at the next boundary, in admission order; failing those, one
  queued item, the oldest, and only at an idle boundary (never inside a turn,
  after a step that called tools); a control item delivers alone, after the
  steers ahead of it, and nothing behind it crosses it; a queued one only at
  an idle boundary with nothing ahead of it; held synthetic input (admitted
  while a revert is staged) never delivers while it is held;
- nothing admitted is lost: every admission is delivered, cancelled or
  still pending, as the inbox says;
- replaying the log rebuilds the same projections.

The suite's run is small; ``SESSIONRT_STATEFUL_EXAMPLES``/``_STEPS`` make a
big one by hand (``SESSIONRT_STATEFUL_SHRINK=0`` reports the first failure
unshrunk).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from pgdb import stored_and_rebuilt

from actors.runtime import Runtime, RuntimeConfig
from protocol import DomainError
from protocol import events as ev
from protocol.requests import CreateSessionInput, PromptInput, SyntheticInput
from protocol.shapes import Location
from storage import RecordedEvent

TEXTS = (
    "#text ok",
    "#delay 3\n#chunk 3\n#text a slower answer",
    "plain words",
    # A tool call: the boundary before its continuation is a steer boundary.
    '#delay 2\n#tool list {"path": "."}\n#step\n#text listed',
)
CONTROL = ("compaction", "move")


@attrs.define
class _Item:
    id: str
    type: str
    delivery: str
    order: int
    held: bool
    #: Where it last became deliverable as it is now (admitted, changed, released).
    since: int
    #: A shell's completion notice (admitted by the shell's end, at any time).
    notice: bool


@attrs.frozen
class Wake:
    """A command that rang the session's doorbell (or may have), as the test saw it.

    ``before``/``after``: the log's last seq before the command and after it
    returned. ``rule``: its place among the commands (an interrupt after it
    voids it). ``cause``: the item it admitted or changed, if any; a synthetic
    admission rings only when not held, a clear only when it released something.
    """

    scope: str
    before: int
    after: int
    rule: int
    kind: str = "wake"
    cause: str | None = None


@attrs.define
class LogWalk:
    """What the walk over the log found: each admitted id's last state (pending,
    delivered, cancelled), the pending items as the walk left them, and facts
    the owed-input check needs."""

    state: dict[str, str]
    pending: dict[str, _Item]
    #: Synthetic ids held behind a staged revert at their admission.
    held_at_admission: set[str]
    #: Seqs of revert clears that released held input.
    releasing_clears: list[int]
    #: Seqs of failed executions and of cancellations.
    failures: list[int]
    cancels: list[int]


def _due(pending: list[_Item], steer_scope: bool) -> list[_Item]:
    """What a boundary delivers from ``pending`` (not held, admission order) by the
    contract: the steers ahead of the first control item; else that control item
    if it is a steer, or (idle boundary) if nothing is ahead of it; else (idle
    boundary) the oldest queued item."""
    ahead: list[_Item] = []
    control = None
    for item in pending:
        if item.type in CONTROL:
            control = item
            break
        ahead.append(item)
    steers = [i for i in ahead if i.delivery == "steer"]
    if steers:
        return steers
    if control is not None and (control.delivery == "steer" or (not steer_scope and not ahead)):
        return [control]
    if not steer_scope and ahead:
        return [ahead[0]]
    return []


def _check_batch(batch: list[str], before: list[_Item], continuing: bool, seq: int) -> None:
    """One promotion (consecutive deliveries, one transaction) against the contract.

    ``before``: the pending input not held, in admission order, when it happened;
    ``continuing``: it happened at a step boundary inside a turn (after a step
    that called tools), where only steers (and a steer control item) deliver.
    """
    where = f"at seq {seq}"
    visible = {i.id: i for i in before}
    for inbox_id in batch:
        assert inbox_id in visible, f"{inbox_id} delivered while a staged revert held it ({where})"
    delivered = [visible[i] for i in batch]
    ahead: list[_Item] = []
    control = None
    for item in before:
        if item.type in CONTROL:
            control = item
            break
        ahead.append(item)
    steers = [i for i in ahead if i.delivery == "steer"]
    if any(i.type in CONTROL for i in delivered):
        # A control item is a boundary: it delivers alone, first control first,
        # after the steers ahead of it; a queued one only at an idle boundary
        # with nothing ahead of it.
        assert len(delivered) == 1, f"a control item delivered with other input {batch} ({where})"
        item = delivered[0]
        assert item is control, f"control {item.id} crossed control {control} ({where})"
        assert not steers, f"control {item.id} delivered before older steers {steers} ({where})"
        if item.delivery == "queue":
            assert not continuing, f"queued control {item.id} delivered inside a turn ({where})"
            assert not ahead, f"queued control {item.id} overtook older input {ahead} ({where})"
        return
    if control is not None:
        crossed = [i for i in delivered if i.order > control.order]
        assert not crossed, f"{crossed} crossed pending control {control.id} ({where})"
    if steers:
        # Every steer ahead of the boundary, in admission order, and nothing else.
        assert [i.id for i in delivered] == [i.id for i in steers], (
            f"delivered {batch} where the steers {[i.id for i in steers]} were due ({where})"
        )
        return
    # No steer ahead: one queued item, the oldest, at an idle boundary only.
    assert not continuing, f"queued {batch} delivered inside a turn ({where})"
    assert len(delivered) == 1, f"more than one queued item at once: {batch} ({where})"
    assert delivered[0] is ahead[0], f"queued {batch} overtook older queued {ahead[0].id} ({where})"


def check_log(records: list[RecordedEvent]) -> LogWalk:
    """Walk the session's log, asserting each promotion obeyed the contract's
    order when it happened (:func:`_check_batch`)."""
    walk = LogWalk(
        state={},
        pending={},
        held_at_admission=set(),
        releasing_clears=[],
        failures=[],
        cancels=[],
    )
    pending = walk.pending
    staged = False
    continuing = False
    order = 0
    batch: list[str] = []
    batch_before: list[_Item] = []
    batch_continuing = False
    batch_seq = 0

    def flush() -> None:
        if batch:
            _check_batch(batch, batch_before, batch_continuing, batch_seq)
            batch.clear()

    def release(seq: int) -> bool:
        held = [i for i in pending.values() if i.held]
        for item in held:
            item.held = False
            item.since = seq
        return bool(held)

    for record in records:
        kind = record.type.rsplit(".", 1)[0]
        data: Any = record.event
        if kind != "session.inbox.delivered":
            flush()
        if kind == "session.revert.staged":
            # A stage over a stage clears first: what was held is not any more.
            release(record.seq)
            staged = True
        elif kind == "session.revert.cleared":
            staged = False
            if release(record.seq):
                walk.releasing_clears.append(record.seq)
        elif kind == "session.revert.committed":
            staged = False
            release(record.seq)
        elif kind == "session.inbox.enqueued":
            order += 1
            held = staged and data.item.type == "synthetic"
            metadata = data.item.payload.get("metadata") or {}
            pending[data.inbox_id] = _Item(
                id=data.inbox_id,
                type=data.item.type,
                delivery=data.item.delivery,
                order=order,
                held=held,
                since=record.seq,
                notice=metadata.get("source") == "shell",
            )
            if held:
                walk.held_at_admission.add(data.inbox_id)
            walk.state[data.inbox_id] = "pending"
        elif kind == "session.inbox.delivery.changed":
            pending[data.inbox_id].delivery = data.delivery
            pending[data.inbox_id].since = record.seq
        elif kind == "session.inbox.cancelled":
            del pending[data.inbox_id]
            walk.state[data.inbox_id] = "cancelled"
            walk.cancels.append(record.seq)
        elif kind == "session.inbox.delivered":
            if not batch:
                batch_before = sorted(
                    (i for i in pending.values() if not i.held), key=lambda i: i.order
                )
                batch_continuing = continuing
                batch_seq = record.seq
            batch.append(data.inbox_id)
            del pending[data.inbox_id]
            walk.state[data.inbox_id] = "delivered"
        elif kind == "session.step.ended":
            continuing = data.finish == "tool-calls"
        elif kind.startswith("session.execution."):
            continuing = False
            if kind == "session.execution.failed":
                walk.failures.append(record.seq)
    flush()
    return walk


def _story(records: list[RecordedEvent]) -> str:
    """The log, one line an event: seq, type, inbox id and delivery where it has them."""
    lines = []
    for r in records:
        data: Any = r.event
        extra = " ".join(
            str(getattr(data, a))
            for a in ("inbox_id", "delivery", "finish")
            if getattr(data, a, None) is not None
        )
        if isinstance(data, ev.InboxEnqueued):
            extra += f" {data.item.type}/{data.item.delivery}"
        lines.append(f"{r.seq} {r.type.rsplit('.', 1)[0]} {extra}")
    return "\n".join(lines)


def owed(walk: LogWalk, wakes: list[Wake], last_interrupt: int) -> list[str]:
    """The input left pending that a wake the runtime rang should have delivered.

    A wake of scope ``input`` runs the session until its idle boundary has
    nothing due: everything deliverable when it rang is delivered. One of scope
    ``steer`` (a delivery changed to steer) delivers what is due at a step
    boundary, and a queued control item at the head with a steer behind it
    (else that steer could never deliver); queued input stays parked.
    Excused: input that became deliverable as it is after the wake
    (admitted, changed or released later; a shell's notice admitted while the
    command ran), input a later interrupt or a failed execution left, and (for
    ``steer``) input a later cancellation made due.
    """
    left = sorted((i for i in walk.pending.values() if not i.held), key=lambda i: i.order)
    found: list[str] = []
    for wake in wakes:
        if wake.rule < last_interrupt or any(s > wake.before for s in walk.failures):
            continue
        if wake.kind == "synthetic" and wake.cause in walk.held_at_admission:
            continue  # held: it rang nothing
        if wake.kind == "clear" and not any(
            wake.before < s <= wake.after for s in walk.releasing_clears
        ):
            continue  # released nothing: it rang nothing
        if wake.scope == "steer":
            if any(s > wake.before for s in walk.cancels):
                continue
            candidates = _due(left, steer_scope=True)
            if not candidates and left and left[0].type in CONTROL:
                # A queued control item at the head holds back the steers behind
                # it: a steer's wake delivers it at its idle boundary, then them.
                behind = [i for i in left[1:] if i.delivery == "steer"]
                candidates = [left[0], *behind] if behind else []
        else:
            candidates = left
        for item in candidates:
            if (
                item.id == wake.cause
                or item.since <= wake.before
                or (item.since <= wake.after and not item.notice)
            ):
                found.append(f"{item.id} ({item.type}/{item.delivery}) after {wake}")
    return found


class DeliveryMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="delivery-"))
        self.dirs = [self.tmp / "a", self.tmp / "b"]
        for d in self.dirs:
            d.mkdir()
        self.loop = asyncio.Runner()
        self.rt: Runtime = self.loop.run(self._open())
        self.sid: str = self.loop.run(
            self.rt.sessions.create(
                CreateSessionInput(location=Location(directory=str(self.dirs[0])))
            )
        ).id
        self.background: list[asyncio.Task[Any]] = []
        self.admitted: set[str] = set()
        #: The doorbells the commands rang (:class:`Wake`), and the place of the
        #: last interrupt among the commands.
        self.wakes: list[Wake] = []
        self.commands = 0
        self.last_interrupt = 0
        #: The rules run, for a failure's message (a timing-dependent one does not replay).
        self.trace: list[str] = []

    async def _open(self) -> Runtime:
        config = RuntimeConfig(data_dir=self.tmp / "data", default_directory=str(self.dirs[0]))
        return await Runtime(config).__aenter__()

    def teardown(self) -> None:
        try:
            self.loop.run(self._settle_and_check())
        finally:
            try:
                self.loop.run(self.rt.__aexit__(None, None, None))
            finally:
                self.loop.close()
                shutil.rmtree(self.tmp, ignore_errors=True)

    def _do(self, work: Any) -> Any:
        """Run one command; a refusal (busy, conflict, not pending …) is an answer too."""

        async def run() -> Any:
            try:
                return await work
            except DomainError:
                return None

        self.commands += 1
        return self.loop.run(run())

    def _ringing(
        self, work: Any, scope: str = "input", kind: str = "wake", cause: str | None = None
    ) -> Any:
        """:meth:`_do` for a command that rings the doorbell once it succeeds."""
        before = self.loop.run(self.rt.store.last_seq(self.sid))
        result = self._do(work)
        if result is not None or kind != "wake":
            after = self.loop.run(self.rt.store.last_seq(self.sid))
            if cause is None and result is not None and hasattr(result, "id"):
                cause = result.id
            self.wakes.append(Wake(scope, before, after, self.commands, kind, cause))
        return result

    def _spawn(self, work: Any) -> None:
        async def spawn() -> None:
            async def quietly() -> None:
                with contextlib.suppress(DomainError):
                    await work

            self.background.append(asyncio.get_running_loop().create_task(quietly()))

        self.commands += 1
        self.loop.run(spawn())

    def _pending(self) -> list[Any]:
        return list(self.loop.run(self.rt.sessions.pending(self.sid)))

    # -- commands -------------------------------------------------------------------------------

    @rule(text=st.sampled_from(TEXTS), delivery=st.sampled_from(["steer", "queue"]))
    def prompt(self, text: str, delivery: Any) -> None:
        self.trace.append(f"prompt(text={text!r}, delivery={delivery!r})")
        item = self._ringing(
            self.rt.sessions.prompt(self.sid, PromptInput(text=text, delivery=delivery))
        )
        if item is not None:
            self.admitted.add(item.id)

    @rule(delivery=st.sampled_from(["steer", "queue"]), resume=st.booleans())
    def synthetic(self, delivery: Any, resume: bool) -> None:
        self.trace.append(f"synthetic(delivery={delivery!r}, resume={resume!r})")
        work = self.rt.sessions.synthetic(
            self.sid, SyntheticInput(text="a note", delivery=delivery, resume=resume)
        )
        item = self._ringing(work, kind="synthetic") if resume else self._do(work)
        if item is not None:
            self.admitted.add(item.id)

    @rule(delivery=st.sampled_from(["steer", "queue"]))
    def compact(self, delivery: Any) -> None:
        self.trace.append(f"compact(delivery={delivery!r})")
        item = self._ringing(self.rt.sessions.compact(self.sid, None, delivery))
        if item is not None:
            self.admitted.add(item.id)

    @rule(to=st.sampled_from([0, 1]), delivery=st.sampled_from(["steer", "queue"]))
    def move(self, to: int, delivery: Any) -> None:
        self.trace.append(f"move(to={to!r}, delivery={delivery!r})")
        item = self._ringing(self.rt.sessions.move(self.sid, str(self.dirs[to]), delivery))
        if item is not None:
            self.admitted.add(item.id)

    @rule(pick=st.integers(min_value=0, max_value=5))
    def cancel(self, pick: int) -> None:
        self.trace.append(f"cancel(pick={pick!r})")
        pending = self._pending()
        if pending:
            self._do(self.rt.sessions.cancel(self.sid, pending[pick % len(pending)].id))

    @rule(pick=st.integers(min_value=0, max_value=5))
    def change_delivery(self, pick: int) -> None:
        self.trace.append(f"change_delivery(pick={pick!r})")
        pending = self._pending()
        if pending:
            item = pending[pick % len(pending)]
            if item.delivery == "steer":
                self._do(self.rt.sessions.change_delivery(self.sid, item.id, "queue"))
            else:
                # Steering rings the doorbell (at step scope); the change answers None.
                self._ringing(
                    self.rt.sessions.change_delivery(self.sid, item.id, "steer"),
                    scope="steer",
                    kind="change",
                    cause=item.id,
                )

    @rule()
    def interrupt(self) -> None:
        self.trace.append("interrupt()")
        self._do(self.rt.interrupt(self.sid))
        self.last_interrupt = self.commands

    @rule()
    def resume(self) -> None:
        self.trace.append("resume()")
        self._spawn(self.rt.resume(self.sid))

    @rule(pick=st.integers(min_value=0, max_value=5))
    def revert_stage(self, pick: int) -> None:
        self.trace.append(f"revert_stage(pick={pick!r})")
        page = self._do(self.rt.sessions.messages(self.sid, order="asc", limit=200))
        users = [m.id for m in page.data if m.type == "user"] if page is not None else []
        if users:
            self._do(self.rt.reverts.stage(self.sid, users[pick % len(users)]))

    @rule()
    def revert_clear(self) -> None:
        self.trace.append("revert_clear()")
        # Rings the doorbell when the clear released held input.
        self._ringing(self.rt.reverts.clear(self.sid), kind="clear")

    @rule()
    def revert_commit(self) -> None:
        self.trace.append("revert_commit()")
        self._do(self.rt.reverts.commit(self.sid))

    @rule()
    def shell(self) -> None:
        self.trace.append("shell()")
        session = self._do(self.rt.sessions.get(self.sid))
        if session is not None:
            self._do(self.rt.shells.start(session, "echo from the shell"))

    @rule()
    def settle(self) -> None:
        self.trace.append("settle()")
        self.loop.run(self._settle_and_check())

    @invariant()
    def session_exists(self) -> None:
        assert self.loop.run(self.rt.store.queries.session(self.sid)) is not None

    # -- the checks -----------------------------------------------------------------------------

    async def _settle_and_check(self) -> None:
        rt, sid = self.rt, self.sid
        async with asyncio.timeout(60):
            # Only what the runtime does by itself: the shells end (each admits
            # its notice, waking nothing), the resumes return, the session goes
            # idle. No doorbell of the test's own: a wake the runtime missed
            # leaves input pending, which is what this looks for.
            await rt.shells.ended()
            for task in self.background:
                with contextlib.suppress(DomainError):
                    await task
            self.background.clear()
            await rt.execution.wait_idle(sid)
        pending = await rt.sessions.pending(sid)
        records = await rt.store.read(sid, limit=100_000)
        walk = check_log(records)
        assert not (stalled := owed(walk, self.wakes, self.last_interrupt)), (
            f"left pending at idle though a wake asked for it: {stalled}\n"
            f"rules: {self.trace}\nlog:\n{_story(records)}"
        )
        lost = {i for i in self.admitted if i not in walk.state}
        assert not lost, f"admitted but never recorded: {lost}"
        assert {i for i, s in walk.state.items() if s == "pending"} == {i.id for i in pending}
        stored, rebuilt = await stored_and_rebuilt(rt.store)
        assert stored == rebuilt


def _settings(examples: int, steps: int) -> settings:
    return settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
        # SESSIONRT_STATEFUL_SHRINK=0: report the first failing sequence as found
        # (shrinking one of 30 steps, each a real runtime's, takes minutes).
        phases=[p for p in Phase if p != Phase.shrink or _size("SESSIONRT_STATEFUL_SHRINK", 1)],
    )


def _size(name: str, default: int) -> int:
    """A run's size from the environment (a big run by hand), else the default."""
    value = os.environ.get(name, "")
    return int(value) if value.strip() else default


class DeliveryMachineOnPostgresql(DeliveryMachine):
    """The same machine with the log on PostgreSQL (the ``postgresql`` mark)."""


#: The suite's run is small (about 8 s of CPU); SESSIONRT_STATEFUL_EXAMPLES and
#: SESSIONRT_STATEFUL_STEPS make a big one by hand, e.g. 300 and 30.
EXAMPLES = _size("SESSIONRT_STATEFUL_EXAMPLES", 12)
STEPS = _size("SESSIONRT_STATEFUL_STEPS", 12)
DeliveryMachine.TestCase.settings = _settings(EXAMPLES, STEPS)
# The rules are the runtime's; the backend only stores them. PostgreSQL runs half
# the sequences (each takes longer there) to check the log replays the same.
DeliveryMachineOnPostgresql.TestCase.settings = _settings(max(1, EXAMPLES // 2), STEPS)
TestDeliveryRules = pytest.mark.slow(DeliveryMachine.TestCase)
TestDeliveryRulesOnPostgresql = pytest.mark.postgresql(
    pytest.mark.slow(DeliveryMachineOnPostgresql.TestCase)
)
