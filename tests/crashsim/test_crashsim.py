"""scripts/crashsim.py: a short real run passes, and its checks catch corrupted histories."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest
from proc_groups import run_in_group
from scripts_loader import load_script

from actors.runtime import Runtime, RuntimeConfig
from protocol import ModelRef
from protocol import events as ev
from protocol.requests import CreateSessionInput, PromptInput
from protocol.shapes import Location
from storage import Command

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "crashsim.py"
VENV_PYTHON = ROOT / ".venv" / "bin" / "python"


crashsim = load_script("crashsim")


@pytest.mark.slow
def test_a_short_run_passes_with_kills_and_admissions(tmp_path: Path) -> None:
    python = VENV_PYTHON if VENV_PYTHON.exists() else Path(sys.executable)
    args = ["--sessions", "3", "--iterations", "3", "--seed", "1", "--json", "--quiet"]
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = run_in_group(
        [str(python), str(SCRIPT), *args],
        cwd=ROOT,
        env=env,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report = json.loads(done.stdout)
    assert report["violations"] == []
    assert report["kills"] >= 3
    assert report["admissions"]["receipts"] > 0
    assert report["events"] > 0
    # Nothing is left behind: the temporary data dir is gone without --keep.
    assert not list(tmp_path.glob("crashsim-*"))


@pytest.mark.slow
def test_a_short_run_of_mid_revert_kills_passes(tmp_path: Path) -> None:
    """Each boot is killed with a revert stopped at a hook point; the next checks the files."""
    python = VENV_PYTHON if VENV_PYTHON.exists() else Path(sys.executable)
    args = ["--modes", "mid-revert", "--sessions", "2", "--iterations", "3", "--seed", "4"]
    done = run_in_group(
        [str(python), str(SCRIPT), *args, "--json", "--quiet"],
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report = json.loads(done.stdout)
    assert report["violations"] == []
    assert report["kill_modes"] == {"mid-revert": 3}
    # Every boot's revert reached its point before the kill (none gave up).
    assert sum(report["retries"]["revert_kills"].values()) == 3
    assert report["notes"] == []


@pytest.mark.slow
def test_a_short_run_of_symlink_revert_kills_passes(tmp_path: Path) -> None:
    """Reverts across symlink swaps, killed at a hook point: the canaries outside
    (beside the tree, in the data dir) and the database stay, each tree as its log says."""
    python = VENV_PYTHON if VENV_PYTHON.exists() else Path(sys.executable)
    args = ["--modes", "symlink-revert", "--sessions", "2", "--iterations", "2", "--seed", "5"]
    done = run_in_group(
        [str(python), str(SCRIPT), *args, "--json", "--quiet"],
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report = json.loads(done.stdout)
    assert report["violations"] == []
    assert report["kill_modes"] == {"symlink-revert": 2}


# -- the checker on a real database, then on corrupted copies ----------------------------------


def _command(ledger: Path, marker: str) -> str:
    return f'echo "S {marker} $PPID $(date +%s%3N)" >> {ledger}; sleep 0.05'


async def _history(tmp_path: Path) -> tuple[Path, list[Any], Path]:
    """A database with a delivered prompt whose tool ran, and a call failed as stale."""
    ledger = tmp_path / "ledger.txt"
    config = RuntimeConfig(data_dir=tmp_path / "data", default_directory=str(tmp_path))
    receipts = []
    async with Runtime(config) as rt:
        s = await rt.sessions.create(CreateSessionInput())
        text = "run it\n#tool bash " + json.dumps({"command": _command(ledger, "CSM_t_ran")})
        item = await rt.sessions.prompt(s.id, PromptInput(id="msg_csT1", text=text))
        receipts.append(crashsim.Receipt.of(item))
        await rt.execution.wait_idle(s.id)
        parked = PromptInput(text="park", delivery="queue", resume=False)
        receipts.append(crashsim.Receipt.of(await rt.sessions.prompt(s.id, parked)))
        # A call left running by a "dead process": the next start fails it, never runs it.
        for event in (
            ev.ExecutionStarted(session_id=s.id),
            ev.StepStarted(
                session_id=s.id,
                assistant_message_id="msg_dead",
                agent="build",
                model=ModelRef(id="scripted", provider_id="scripted"),
                started=1,
            ),
            ev.ToolCalled(
                session_id=s.id,
                assistant_message_id="msg_dead",
                id="call_0_0",
                name="bash",
                input={"command": _command(ledger, "CSM_t_stale")},
            ),
        ):
            await rt.store.append(Command.of(event))
    async with Runtime(config) as rt:
        await rt.execution.wait_idle(s.id)
    return config.db_path, receipts, ledger


def _copy(db: Path, to: Path) -> Path:
    source = sqlite3.connect(db)
    target = sqlite3.connect(to)
    try:
        source.backup(target)
    finally:
        source.close()
        target.close()
    return to


def _checks(violations: list[Any]) -> set[str]:
    return {v.check for v in violations}


async def test_the_checker_passes_the_real_history(tmp_path: Path) -> None:
    db, receipts, ledger = await _history(tmp_path)
    assert ledger.read_text().count("S CSM_t_ran ") == 1
    assert crashsim.check_database(db, receipts, ledger) == []


async def test_the_checker_catches_a_revert_intent_left_after_the_settle(tmp_path: Path) -> None:
    db, receipts, ledger = await _history(tmp_path)
    intents = db.parent / "revert"
    intents.mkdir()
    (intents / "ses_left.json").write_bytes(b"{}")
    found = _checks(crashsim.check_database(db, receipts, ledger))
    assert found == {"revert.intent-left"}
    # Before the settle an intent may still be waiting for the next start's recovery.
    assert crashsim.check_database(db, receipts, ledger, settled=False) == []


async def test_the_checker_compares_the_files_a_revert_restored(tmp_path: Path) -> None:
    """(g) files: staged then cleared, the project passes; a file left unrestored does not."""
    project, ledger = tmp_path / "project", tmp_path / "none.txt"
    ledger.write_text("")
    await asyncio.to_thread(crashsim._git_project, project)
    config = RuntimeConfig(data_dir=tmp_path / "data", default_directory=str(tmp_path))

    def write(**files: str) -> str:
        calls = [f"#tool write {json.dumps({'path': p, 'content': c})}" for p, c in files.items()]
        return "\n".join([*calls, "---", "#text ok"])

    async with Runtime(config) as rt:
        s = await rt.sessions.create(CreateSessionInput(location=Location(directory=str(project))))
        await rt.sessions.prompt(s.id, PromptInput(text=write(f0="one")))
        await rt.execution.wait_idle(s.id)
        second = await rt.sessions.prompt(s.id, PromptInput(text=write(f0="two", f1="new")))
        await rt.execution.wait_idle(s.id)
        await rt.reverts.stage(s.id, second.id, files=True)
        assert (project / "f0").read_text() == "one"
        assert crashsim.check_database(config.db_path, [], ledger) == []
        # As if a kill mid-restore had left the rest undone and nobody finished it.
        (project / "f1").write_text("new")
        found = crashsim.check_database(config.db_path, [], ledger)
        assert _checks(found) == {"revert.files"}
        assert "f1" in found[0].detail
        (project / "f1").unlink()
        await rt.reverts.clear(s.id)
        assert crashsim.check_database(config.db_path, [], ledger) == []
        (project / "f0").write_text("one")  # the clear's restore of f0 undone
        assert _checks(crashsim.check_database(config.db_path, [], ledger)) == {"revert.files"}


async def test_the_checker_keeps_a_shell_running_at_a_commit_and_catches_other_leftovers(
    tmp_path: Path,
) -> None:
    """(g): a commit keeps a user shell still running (by design); any other row is a leftover."""
    ledger = tmp_path / "none.txt"
    ledger.write_text("")
    config = RuntimeConfig(data_dir=tmp_path / "data", default_directory=str(tmp_path))
    async with Runtime(config) as rt:
        s = await rt.sessions.create(CreateSessionInput())
        first = await rt.sessions.prompt(s.id, PromptInput(text="#text one"))
        await rt.execution.wait_idle(s.id)
        await rt.sessions.prompt(s.id, PromptInput(text="#text two"))
        await rt.execution.wait_idle(s.id)
        gate = tmp_path / "go"
        await rt.shells.start(s, f"while [ ! -e {gate} ]; do sleep 0.02; done", "msg_csLive1")
        await rt.reverts.stage(s.id, first.id)
        await rt.reverts.commit(s.id)
        gate.write_text("")
        while not await rt.sessions.pending(s.id):
            await rt.sessions.get(s.id)  # the shell's notice arrives with its end
    db = config.db_path
    assert crashsim.check_database(db, [], ledger) == []
    broken = _copy(db, tmp_path / "broken.sqlite")
    conn = sqlite3.connect(broken)
    with conn:
        # As if the commit had kept a finished shell: ended before the commit.
        conn.execute("UPDATE event SET seq = seq + 1000 WHERE type = 'session.revert.committed.1'")
    conn.close()
    assert "revert.leftover" in _checks(crashsim.check_database(broken, [], ledger))


async def test_the_checker_catches_a_lost_admission(tmp_path: Path) -> None:
    db, receipts, ledger = await _history(tmp_path)
    broken = _copy(db, tmp_path / "broken.sqlite")
    conn = sqlite3.connect(broken)
    with conn:
        conn.execute(
            "DELETE FROM event WHERE type LIKE 'session.inbox.enqueued.%'"
            " AND json_extract(data, '$.inboxID') = ?",
            (receipts[0].inbox_id,),
        )
    conn.close()
    found = _checks(crashsim.check_database(broken, receipts, ledger))
    # The replay trips over the delivery of an item never enqueued.
    assert found == {"admission.lost", "seq.not-contiguous", "rebuild.failed"}


async def test_the_checker_catches_a_replayed_aborted_call(tmp_path: Path) -> None:
    db, receipts, ledger = await _history(tmp_path)
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    (failed,) = conn.execute(
        "SELECT created FROM event WHERE type LIKE 'session.tool.failed.%'"
        " AND json_extract(data, '$.error.type') = 'aborted'"
    ).fetchone()
    conn.close()
    forged = tmp_path / "forged-ledger.txt"
    replay = f"S CSM_t_stale {os.getpid()} {failed + 5}\n"
    forged.write_text(ledger.read_text() + replay + replay)
    found = _checks(crashsim.check_database(db, receipts, forged))
    assert found == {"tool.executed-twice", "tool.after-abort"}


async def test_the_checker_catches_a_duplicated_ledger_line_and_unknown_effects(
    tmp_path: Path,
) -> None:
    db, receipts, ledger = await _history(tmp_path)
    lines = ledger.read_text().splitlines()
    forged = tmp_path / "forged-ledger.txt"
    forged.write_text("\n".join([*lines, *lines, "S CSM_t_nobody 1 1", "garbage"]) + "\n")
    found = _checks(crashsim.check_database(db, receipts, forged))
    assert found == {"tool.executed-twice", "tool.undurable", "ledger.malformed"}


async def test_the_checker_catches_a_run_by_a_later_process(tmp_path: Path) -> None:
    db, receipts, ledger = await _history(tmp_path)
    line = ledger.read_text().split()
    called_by = crashsim.Boot(index=0, pid=int(line[2]), spawn_ms=0)
    later = crashsim.Boot(index=1, pid=int(line[2]) + 1, spawn_ms=int(line[3]) + 10**9)
    assert crashsim.check_database(db, receipts, ledger, [called_by, later]) == []
    forged = tmp_path / "forged-ledger.txt"
    forged.write_text(f"S {line[1]} {later.pid} {line[3]}\n")
    found = _checks(crashsim.check_database(db, receipts, forged, [called_by, later]))
    assert found == {"tool.wrong-process"}


async def test_the_checker_catches_a_claim_left_and_mismatched_receipts(tmp_path: Path) -> None:
    db, receipts, ledger = await _history(tmp_path)
    broken = _copy(db, tmp_path / "broken.sqlite")
    conn = sqlite3.connect(broken)
    with conn:
        conn.execute("UPDATE session SET time_claimed = 1, resume_attempts = 3")
    conn.close()
    lying = [*receipts, crashsim.Receipt(**{**receipts[0].__dict__, "time_created": 1})]
    found = _checks(crashsim.check_database(broken, lying, ledger))
    assert found == {"claim.unreleased", "receipt.mismatch", "rebuild.mismatch"}
    unsettled = _checks(crashsim.check_database(broken, receipts, ledger, settled=False))
    assert unsettled == {"rebuild.mismatch"}  # within the bound while still running
    over = _checks(crashsim.check_database(broken, receipts, ledger, max_attempts=2))
    assert "claim.unbounded" in over


async def test_the_checker_catches_overlapping_lease_epochs(tmp_path: Path) -> None:
    db, receipts, ledger = await _history(tmp_path)
    broken = _copy(db, tmp_path / "broken.sqlite")
    conn = sqlite3.connect(broken)
    with conn:
        rows = conn.execute(
            "SELECT position, session_id, host_id, epoch FROM event_fence ORDER BY position"
        ).fetchall()
        assert rows, "the real history has fenced events"
        epochs = {r[3] for r in rows}
        assert len(epochs) >= 2  # the restart took the lease again
        # A write under the first epoch after a later one: a fenced host that wrote anyway.
        position = rows[-1][0]
        conn.execute(
            "UPDATE event_fence SET epoch = ?, host_id = ? WHERE position = ?",
            (min(epochs), "host-late", position),
        )
    conn.close()
    found = _checks(crashsim.check_database(broken, receipts, ledger))
    assert found == {"fence.overlap", "fence.shared-epoch"}


async def test_the_checker_catches_tool_calls_left_open(tmp_path: Path) -> None:
    db, receipts, ledger = await _history(tmp_path)
    broken = _copy(db, tmp_path / "broken.sqlite")
    conn = sqlite3.connect(broken)
    with conn:
        conn.execute("DELETE FROM event WHERE type LIKE 'session.tool.success.%'")
        conn.execute("UPDATE session_part SET status = 'running' WHERE key LIKE 'tool:%'")
    conn.close()
    found = _checks(crashsim.check_database(broken, receipts, ledger))
    assert {"tool.unsettled", "tool.part-open", "seq.not-contiguous"} <= found
    assert found & {"rebuild.mismatch", "rebuild.failed"}
    assert "tool.unsettled" not in _checks(
        crashsim.check_database(broken, receipts, ledger, settled=False)
    )


async def _shell_history(tmp_path: Path) -> Path:
    """A database with one finished user shell (its end and notice in one transaction)."""
    config = RuntimeConfig(data_dir=tmp_path / "data", default_directory=str(tmp_path))
    async with Runtime(config) as rt:
        s = await rt.sessions.create(CreateSessionInput())
        await rt.shells.start(s, "echo hi", "msg_csSH1")
        while not await rt.sessions.pending(s.id):
            await rt.sessions.get(s.id)  # the shell's notice arrives with its end
    return config.db_path


async def test_the_checker_passes_shells_and_catches_a_lost_or_doubled_notice(
    tmp_path: Path,
) -> None:
    db = await _shell_history(tmp_path)
    ledger = tmp_path / "none.txt"
    ledger.write_text("")
    assert crashsim.check_database(db, [], ledger) == []
    broken = _copy(db, tmp_path / "broken.sqlite")
    conn = sqlite3.connect(broken)
    with conn:
        # The notice gone: the end was recorded without it.
        conn.execute("DELETE FROM session_inbox")
        conn.execute(
            "DELETE FROM event WHERE type = 'session.inbox.enqueued.1'"
            " AND json_extract(data, '$.inboxID') = 'msg_csSH1n'"
        )
    conn.close()
    assert "shell.notice" in _checks(crashsim.check_database(broken, [], ledger))
    # A shell left running after the settle.
    running = _copy(db, tmp_path / "running.sqlite")
    conn = sqlite3.connect(running)
    with conn:
        conn.execute("DELETE FROM event WHERE type = 'session.shell.ended.1'")
        conn.execute(
            "UPDATE session_message SET data = json_set(data, '$.shell.state', 'running')"
            " WHERE type = 'shell'"
        )
    conn.close()
    found = _checks(crashsim.check_database(running, [], ledger))
    assert {"shell.never-ended", "shell.projection", "shell.notice"} <= found


# -- (h) permissions: a real asked call, then forged histories ---------------------------------


async def _asked_history(tmp_path: Path) -> tuple[Path, Path]:
    """A database where one asking call was answered ``once`` and ran."""
    ledger = tmp_path / "ledger.txt"
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    (data / "agents.toml").write_text(crashsim.AGENTS_TOML)
    config = RuntimeConfig(data_dir=data, default_directory=str(tmp_path))
    async with Runtime(config) as rt:
        s = await rt.sessions.create(CreateSessionInput(agent=crashsim.AGENT))
        command = f"{crashsim.ASK}; " + _command(ledger, "CSM_t_asked")
        await rt.sessions.prompt(
            s.id, PromptInput(text="#tool bash " + json.dumps({"command": command}))
        )
        pending: list[Any] = []
        async with asyncio.timeout(30):  # a guard, never the assertion
            for _ in itertools.count():
                if pending := await rt.sessions.permissions(s.id):
                    break
                await asyncio.sleep(0.01)
        assert not ledger.exists()  # waiting: nothing ran
        await rt.sessions.reply_permission(s.id, pending[0].id, "once")
        await rt.execution.wait_idle(s.id)
    return config.db_path, ledger


def _permission_checks(db: Path, ledger: Path, edit: Any = None) -> set[str]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        events = crashsim.load_events(conn)
        if edit is not None:
            events = edit(events)
        lines, _ = crashsim.read_ledger(ledger)
        return _checks(crashsim.check_permissions(conn, events, lines))
    finally:
        conn.close()


async def test_the_permission_checker_passes_an_answered_call_and_catches_forgeries(
    tmp_path: Path,
) -> None:
    db, ledger = await _asked_history(tmp_path)
    assert ledger.read_text().count("S CSM_t_asked ") == 1
    assert _permission_checks(db, ledger) == set()
    assert crashsim.check_database(db, [], ledger) == []

    def replied(events: list[Any]) -> Any:
        return next(e for e in events if e.type == "session.permission.replied")

    def without_reply(events: list[Any]) -> list[Any]:
        return [e for e in events if e.type != "session.permission.replied"]

    def rejected(events: list[Any]) -> list[Any]:
        r = replied(events)
        forged = dataclasses.replace(r, data={**r.data, "reply": "reject"})
        return [forged if e is r else e for e in events]

    def late(events: list[Any]) -> list[Any]:
        r = replied(events)
        forged = dataclasses.replace(r, created=r.created + 10**6)
        return [forged if e is r else e for e in events]

    def twice(events: list[Any]) -> list[Any]:
        return [*events, replied(events)]

    def unasked(events: list[Any]) -> list[Any]:
        return [e for e in events if not e.type.startswith("session.permission.")]

    assert _permission_checks(db, ledger, without_reply) == {"permission.ran-unallowed"}
    assert _permission_checks(db, ledger, rejected) == {
        "permission.ran-unallowed",
        "permission.rejected-succeeded",
    }
    assert _permission_checks(db, ledger, late) == {"permission.ran-before-answer"}
    assert _permission_checks(db, ledger, twice) == {"permission.replied-twice"}
    assert _permission_checks(db, ledger, unasked) == {"permission.ran-unasked"}

    broken = _copy(db, tmp_path / "broken.sqlite")
    conn = sqlite3.connect(broken)
    with conn:
        conn.execute("UPDATE session_permission SET status = 'pending'")
    conn.close()
    assert _permission_checks(broken, ledger) == {"permission.pending-after-settle"}
