"""Random command sequences against one session: the delivery rules hold after each settle.

A hypothesis state machine drives a real runtime (SQLite file, scripted
model, real shells) with prompts (steer/queue), synthetic input, manual
compactions, moves, cancels, delivery changes, interrupts, resumes, revert
stage/clear/commit and user shells, without waiting between them. A ``settle``
rule waits for the shells, rings one advisory wake (what any later admission
would ring) and waits for the session to go idle; then it checks:

- nothing deliverable is left in the inbox (nothing stalls);
- the log's deliveries follow the contract: no input crosses a pending
  control item; steers go in enqueue order and before queued input; a
  queued item delivers only when no steer is ahead of the first control
  item; held synthetic input (admitted while a revert is staged) never
  delivers while it is held;
- nothing admitted is lost: every admission is delivered, cancelled or
  still pending;
- replaying the log rebuilds the same projections.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from pgdb import stored_and_rebuilt

from actors.runtime import Runtime, RuntimeConfig
from protocol import DomainError
from protocol.requests import CreateSessionInput, PromptInput, SyntheticInput
from protocol.shapes import Location
from storage import RecordedEvent

TEXTS = ("#text ok", "#delay 3\n#chunk 3\n#text a slower answer", "plain words")
CONTROL = ("compaction", "move")


@attrs.define
class _Item:
    id: str
    type: str
    delivery: str
    order: int
    held: bool


def check_log(records: list[RecordedEvent]) -> tuple[dict[str, str], set[str]]:
    """Walk the session's log, asserting each delivery obeyed the rules when it
    happened; returns each admitted id's last state (pending, delivered,
    cancelled) and the ids a staged revert holds now."""
    pending: dict[str, _Item] = {}
    state: dict[str, str] = {}
    staged = False
    order = 0
    for record in records:
        kind = record.type.rsplit(".", 1)[0]
        data: Any = record.event
        if kind == "session.revert.staged":
            # A stage over a stage clears first: what was held is not any more.
            for item in pending.values():
                item.held = False
            staged = True
        elif kind in ("session.revert.cleared", "session.revert.committed"):
            staged = False
            for item in pending.values():
                item.held = False
        elif kind == "session.inbox.enqueued":
            order += 1
            pending[data.inbox_id] = _Item(
                id=data.inbox_id,
                type=data.item.type,
                delivery=data.item.delivery,
                order=order,
                held=staged and data.item.type == "synthetic",
            )
            state[data.inbox_id] = "pending"
        elif kind == "session.inbox.delivery.changed":
            pending[data.inbox_id].delivery = data.delivery
        elif kind == "session.inbox.cancelled":
            del pending[data.inbox_id]
            state[data.inbox_id] = "cancelled"
        elif kind == "session.inbox.delivered":
            item = pending.pop(data.inbox_id)
            state[data.inbox_id] = "delivered"
            assert not item.held, f"{item.id} delivered while a staged revert held it"
            ahead = sorted(
                (i for i in pending.values() if i.order < item.order and not i.held),
                key=lambda i: i.order,
            )
            assert not any(i.type in CONTROL for i in ahead), (
                f"{item.id} crossed a pending control item"
            )
            assert not any(i.delivery == "steer" for i in ahead), (
                f"{item.id} delivered before an older steer"
            )
            if item.delivery == "queue" and item.type not in CONTROL:
                # Steers take priority up to the first control item, behind it too.
                first_control = min(
                    (i.order for i in pending.values() if i.type in CONTROL and not i.held),
                    default=None,
                )
                steers_ahead_of_boundary = [
                    i
                    for i in pending.values()
                    if i.delivery == "steer"
                    and i.type not in CONTROL
                    and not i.held
                    and (first_control is None or i.order < first_control)
                ]
                assert not steers_ahead_of_boundary, f"queued {item.id} overtook a steer"
    return state, {i.id for i in pending.values() if i.held}


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

        return self.loop.run(run())

    def _spawn(self, work: Any) -> None:
        async def spawn() -> None:
            async def quietly() -> None:
                with contextlib.suppress(DomainError):
                    await work

            self.background.append(asyncio.get_running_loop().create_task(quietly()))

        self.loop.run(spawn())

    def _pending(self) -> list[Any]:
        return list(self.loop.run(self.rt.sessions.pending(self.sid)))

    # -- commands -------------------------------------------------------------------------------

    @rule(text=st.sampled_from(TEXTS), delivery=st.sampled_from(["steer", "queue"]))
    def prompt(self, text: str, delivery: Any) -> None:
        item = self._do(
            self.rt.sessions.prompt(self.sid, PromptInput(text=text, delivery=delivery))
        )
        if item is not None:
            self.admitted.add(item.id)

    @rule(delivery=st.sampled_from(["steer", "queue"]), resume=st.booleans())
    def synthetic(self, delivery: Any, resume: bool) -> None:
        item = self._do(
            self.rt.sessions.synthetic(
                self.sid, SyntheticInput(text="a note", delivery=delivery, resume=resume)
            )
        )
        if item is not None:
            self.admitted.add(item.id)

    @rule(delivery=st.sampled_from(["steer", "queue"]))
    def compact(self, delivery: Any) -> None:
        item = self._do(self.rt.sessions.compact(self.sid, None, delivery))
        if item is not None:
            self.admitted.add(item.id)

    @rule(to=st.sampled_from([0, 1]), delivery=st.sampled_from(["steer", "queue"]))
    def move(self, to: int, delivery: Any) -> None:
        item = self._do(self.rt.sessions.move(self.sid, str(self.dirs[to]), delivery))
        if item is not None:
            self.admitted.add(item.id)

    @rule(pick=st.integers(min_value=0, max_value=5))
    def cancel(self, pick: int) -> None:
        pending = self._pending()
        if pending:
            self._do(self.rt.sessions.cancel(self.sid, pending[pick % len(pending)].id))

    @rule(pick=st.integers(min_value=0, max_value=5))
    def change_delivery(self, pick: int) -> None:
        pending = self._pending()
        if pending:
            item = pending[pick % len(pending)]
            other = "queue" if item.delivery == "steer" else "steer"
            self._do(self.rt.sessions.change_delivery(self.sid, item.id, other))

    @rule()
    def interrupt(self) -> None:
        self._do(self.rt.interrupt(self.sid))

    @rule()
    def resume(self) -> None:
        self._spawn(self.rt.resume(self.sid))

    @rule(pick=st.integers(min_value=0, max_value=5))
    def revert_stage(self, pick: int) -> None:
        page = self._do(self.rt.sessions.messages(self.sid, order="asc", limit=200))
        users = [m.id for m in page.data if m.type == "user"] if page is not None else []
        if users:
            self._do(self.rt.reverts.stage(self.sid, users[pick % len(users)]))

    @rule()
    def revert_clear(self) -> None:
        self._do(self.rt.reverts.clear(self.sid))

    @rule()
    def revert_commit(self) -> None:
        self._do(self.rt.reverts.commit(self.sid))

    @rule()
    def shell(self) -> None:
        session = self._do(self.rt.sessions.get(self.sid))
        if session is not None:
            self._do(self.rt.shells.start(session, "echo from the shell"))

    @precondition(lambda self: True)
    @rule()
    def settle(self) -> None:
        self.loop.run(self._settle_and_check())

    @invariant()
    def session_exists(self) -> None:
        assert self.loop.run(self.rt.store.queries.session(self.sid)) is not None

    # -- the checks -----------------------------------------------------------------------------

    async def _settle_and_check(self) -> None:
        rt, sid = self.rt, self.sid
        async with asyncio.timeout(60):
            # The shells' ends (each admits its notice), then the resumes.
            await asyncio.gather(*list(rt.shells._tasks), return_exceptions=True)
            for task in self.background:
                with contextlib.suppress(DomainError):
                    await task
            self.background.clear()
            rt.execution.wake(sid, "input")
            await rt.execution.wait_idle(sid)
        pending = await rt.sessions.pending(sid)
        records = await rt.store.read(sid, limit=100_000)
        state, held = check_log(records)
        # At the idle boundary something always delivers while anything not
        # held is pending (steers, else the head control item, else the
        # oldest queued item): so nothing but held input may be left.
        left = [i for i in pending if i.id not in held]
        assert not left, f"left deliverable at idle: {left}"
        lost = {i for i in self.admitted if i not in state}
        assert not lost, f"admitted but never recorded: {lost}"
        for item in pending:
            assert state[item.id] == "pending"
        assert {i for i, s in state.items() if s == "pending"} == {i.id for i in pending}
        stored, rebuilt = await stored_and_rebuilt(rt.store)
        assert stored == rebuilt


def _settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        stateful_step_count=12,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )


class DeliveryMachineOnPostgresql(DeliveryMachine):
    """The same machine with the log on PostgreSQL (the ``postgresql`` mark)."""


DeliveryMachine.TestCase.settings = _settings(12)
# The rules are the runtime's; the backend only stores them. PostgreSQL runs fewer
# sequences (each takes longer there) to check the log replays the same.
DeliveryMachineOnPostgresql.TestCase.settings = _settings(6)
TestDeliveryRules = pytest.mark.slow(DeliveryMachine.TestCase)
TestDeliveryRulesOnPostgresql = pytest.mark.postgresql(
    pytest.mark.slow(DeliveryMachineOnPostgresql.TestCase)
)
