"""The startup sweep: claims, the attempt bound, concurrency, no replay."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path

import pytest
from feed import Feed
from owner_seams import Arrivals, Parked, first_of, written

from actors.recovery import RESTART_NOTICE, recover
from actors.runtime import Runtime, RuntimeConfig
from actors.sessions import Sessions
from protocol import ModelRef, SyntheticMessage
from protocol import events as ev
from protocol.requests import CreateSessionInput, PromptInput
from storage import Command


def config(tmp_path: Path, **extra: object) -> RuntimeConfig:
    return RuntimeConfig(
        data_dir=tmp_path / "data",
        default_directory=str(tmp_path),
        **extra,  # type: ignore[arg-type]
    )


async def claimed_sessions(tmp_path: Path, n: int, script: str | None = None) -> list[str]:
    """Sessions left claimed, as by a process that died mid-execution."""
    async with Runtime(config(tmp_path, recover=False)) as rt:
        ids = []
        for _ in range(n):
            metadata = None if script is None else {"script": script}
            s = await rt.sessions.create(CreateSessionInput(metadata=metadata))
            if script is not None:
                await rt.sessions.prompt(s.id, PromptInput(text="go", resume=False))
            await rt.store.append(Command.of(ev.ExecutionStarted(session_id=s.id)))
            ids.append(s.id)
        return ids


async def test_a_shutdown_keeps_the_claim_and_the_next_start_resumes_once(
    tmp_path: Path,
) -> None:
    cfg = config(tmp_path)
    async with Runtime(cfg) as rt:
        feed = Feed()
        rt.bus.subscribe(feed)
        s = await rt.sessions.create()
        await rt.sessions.prompt(s.id, PromptInput(text='#tool bash {"command": "sleep 30"}'))
        await feed.wait("session.tool.called", sessionID=s.id)
    async with Runtime(cfg) as rt:
        assert rt.recovery.resumed == (s.id,)
        await rt.execution.wait_idle(s.id)
        messages = (await rt.sessions.messages(s.id, order="asc")).data
        notices = [m for m in messages if isinstance(m, SyntheticMessage)]
        assert [n.text for n in notices] == [RESTART_NOTICE]
        assert notices[0].metadata == {"notice": "restart", "attempt": 1}
        assert await rt.store.queries.claims() == []  # released by the recovered terminal
        rows = await rt.store.fetch("SELECT resume_attempts FROM session WHERE id = ?", (s.id,))
        assert rows[0][0] == 0
        types = [r.type for r in await rt.store.read(s.id, limit=1000)]
        # The shutdown failed the running tool and kept the claim; it is never rerun.
        assert types.count("session.tool.called.1") == 1
        assert types.count("session.tool.failed.2") == 1
        shutdown = types.index("session.execution.interrupted.1")
        assert types.index("session.tool.failed.2") < shutdown
        assert types.index("session.execution.recovering.1") > shutdown
    async with Runtime(cfg) as rt:
        assert rt.recovery.resumed == ()  # nothing claimed any more


async def test_stale_tools_are_failed_not_replayed(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    ids = await claimed_sessions(tmp_path, 1)
    sid = ids[0]
    async with Runtime(config(tmp_path, recover=False)) as rt:
        for event in (
            ev.StepStarted(
                session_id=sid,
                assistant_message_id="msg_dead",
                agent="build",
                model=ModelRef(id="scripted", provider_id="scripted"),
                started=1,
            ),
            ev.ToolCalled(
                session_id=sid,
                assistant_message_id="msg_dead",
                id="call_0_0",
                name="bash",
                input={"command": f"echo once >> {ledger}"},
            ),
        ):
            await rt.store.append(Command.of(event))
    async with Runtime(config(tmp_path)) as rt:
        await rt.execution.wait_idle(sid)
        failed = [r for r in await rt.store.read(sid) if r.type == "session.tool.failed.2"]
        assert failed[0].event.error.type == "aborted"  # type: ignore[union-attr]
    assert not ledger.exists()


async def test_the_attempt_bound_terminalizes_instead_of_crash_looping(tmp_path: Path) -> None:
    [sid] = await claimed_sessions(tmp_path, 1)
    # The log as the runtime keeps it (on either backend), without its sweep.
    async with Runtime(config(tmp_path, recover=False)) as idle:
        await idle.store.append(Command.of(ev.ExecutionRecovering(session_id=sid, attempt=2)))
    async with Runtime(config(tmp_path, max_resume_attempts=2)) as rt:
        assert rt.recovery.exhausted == (sid,)
        assert rt.recovery.resumed == ()
        last = (await rt.store.read(sid))[-1]
        assert last.type == "session.execution.failed.1"
        assert last.event.error.type == "aborted"  # type: ignore[union-attr]
        assert await rt.store.queries.claims() == []
        assert await rt.sessions.pending(sid) == []  # no notice admitted


async def test_every_attempt_is_counted_before_resuming(tmp_path: Path) -> None:
    [sid] = await claimed_sessions(tmp_path, 1)
    for attempt in (1, 2, 3):
        # A crash right after counting: the next boot counts again.
        async with Runtime(config(tmp_path, recover=False)) as idle:
            store = idle.store
            await store.append(Command.of(ev.ExecutionRecovering(session_id=sid, attempt=attempt)))
            claims = await store.queries.claims()
            assert [(c.session_id, c.resume_attempts) for c in claims] == [(sid, attempt)]
    async with Runtime(config(tmp_path)) as rt:
        assert rt.recovery.resumed == (sid,)
        recovering = [
            r for r in await rt.store.read(sid) if r.type.startswith("session.execution.rec")
        ]
        assert [r.event.attempt for r in recovering] == [1, 2, 3, 4]  # type: ignore[union-attr]


async def test_claimed_sessions_resume_concurrently_and_once(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    script = f'#tool bash {{"command": "while [ ! -f {gate} ]; do sleep 0.01; done"}}'
    ids = await claimed_sessions(tmp_path, 5, script=script)
    runtime = Runtime(config(tmp_path))
    feed = Feed()
    runtime.bus.subscribe(feed)  # before start: recovery runs inside __aenter__
    async with runtime as rt:
        assert sorted(rt.recovery.resumed) == sorted(ids)
        # Every session is inside its tool at once: none waited for another.
        for sid in ids:
            await feed.wait("session.tool.called", sessionID=sid)
        assert sorted(await rt.execution.active()) == sorted(ids)
        gate.touch()
        for sid in ids:
            await rt.execution.wait_idle(sid)
        for sid in ids:
            types = [r.type for r in await rt.store.read(sid, limit=1000)]
            assert types.count("session.execution.recovering.1") == 1
            assert types.count("session.execution.succeeded.1") == 1


async def test_the_sweep_leaves_sessions_already_running_here_alone(
    tmp_path: Path, workdir: Path
) -> None:
    gate = workdir / "gate"
    async with Runtime(config(tmp_path)) as rt:
        feed = Feed()
        rt.bus.subscribe(feed)
        s = await rt.sessions.create()
        script = f'#tool bash {{"command": "while [ ! -f {gate} ]; do sleep 0.01; done"}}'
        await rt.sessions.prompt(s.id, PromptInput(text=script))
        await feed.wait("session.tool.called", sessionID=s.id)
        report = await rt.recover()
        assert report.skipped_running == (s.id,)
        assert report.resumed == ()
        gate.touch()
        await rt.execution.wait_idle(s.id)
        types = [r.type for r in await rt.store.read(s.id, limit=1000)]
        assert "session.execution.recovering.1" not in types


async def test_orphaned_child_claims_are_released(tmp_path: Path) -> None:
    async with Runtime(config(tmp_path, recover=False)) as rt:
        parent = await rt.sessions.create()
        child = await rt.sessions.create(CreateSessionInput(parent_id=parent.id))
        for sid in (parent.id, child.id):
            await rt.store.append(Command.of(ev.ExecutionStarted(session_id=sid)))
    async with Runtime(config(tmp_path)) as rt:
        assert rt.recovery.orphans_released == (child.id,)
        assert rt.recovery.resumed == (parent.id,)
        await rt.execution.wait_idle(parent.id)
        assert await rt.store.queries.claims() == []
        last = (await rt.store.read(child.id))[-1]
        assert last.type == "session.execution.failed.1"


async def test_recovery_can_be_turned_off(tmp_path: Path) -> None:
    ids = await claimed_sessions(tmp_path, 1)
    async with Runtime(config(tmp_path, recover=False)) as rt:
        assert rt.recovery.resumed == ()
        assert [c.session_id for c in await rt.store.queries.claims()] == ids


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    path = tmp_path / "w"
    path.mkdir()
    return path


async def test_the_sweeps_writes_wait_for_the_command_the_sessions_actor_runs(
    tmp_path: Path,
) -> None:
    async with Runtime(config(tmp_path, recover=False)) as rt:
        parent = await rt.sessions.create()
        child = await rt.sessions.create(CreateSessionInput(parent_id=parent.id))
        tooled = await rt.sessions.create()
        for sid in (parent.id, child.id):
            await rt.store.append(Command.of(ev.ExecutionStarted(session_id=sid)))
        # A tool call a dead process left open, its group long gone (another boot).
        for event in (
            ev.StepStarted(
                session_id=tooled.id,
                assistant_message_id="msg_dead",
                agent="build",
                model=ModelRef(id="scripted", provider_id="scripted"),
                started=1,
            ),
            ev.ToolCalled(
                session_id=tooled.id,
                assistant_message_id="msg_dead",
                id="call_0_0",
                name="bash",
                input={"command": "true"},
            ),
            ev.ToolSpawned(
                session_id=tooled.id,
                assistant_message_id="msg_dead",
                id="call_0_0",
                pgid=4_000_000,
                start_ticks=1,
                boot_id="a-boot-long-gone",
            ),
        ):
            await rt.store.append(Command.of(event))
        arrivals = Arrivals(rt.execution)
        sessions = Sessions(rt.store, owners=arrivals)
        # What the sweep writes for each, and the command each actor is running meanwhile.
        steps = [
            (tooled.id, "session.tool.failed"),
            (child.id, "session.execution.failed"),
            (parent.id, "session.execution.recovering"),
        ]
        parked, seen, asked = {}, {}, {}
        for sid, type_ in steps:
            renamed = ev.SessionRenamed(session_id=sid, title="written by its own command")
            parked[sid] = Parked(
                rt.execution, sid, functools.partial(rt.store.append, Command.of(renamed))
            )
            await parked[sid].running.wait()
            seen[sid] = written(rt.store, sid, type_)
            asked[sid] = arrivals.expect(sid)
        sweep = asyncio.ensure_future(
            recover(rt.store, sessions, rt.execution, rt.blocking, rt.leases)
        )
        for sid, _ in steps:
            # The sweep either asks the session's actor or writes past it.
            await first_of(asked[sid], seen[sid])
            assert not seen[sid].is_set(), sid
            await parked[sid].release()
        report = await sweep
        assert report.stale_tools == ("call_0_0",)
        assert report.orphans_released == (child.id,)
        assert report.resumed == (parent.id,)
        for sid, type_ in steps:
            types = [r.type.rsplit(".", 1)[0] for r in await rt.store.read(sid)]
            assert types.index("session.renamed") < types.index(type_), sid
        await rt.execution.wait_idle(parent.id)
