"""A large import goes in bounded commands, and readers see it whole or not at all (issue 35).

Other sessions' appends commit between the import's commands (the point of
writing it in pieces); until its last command the session is not read,
listed or counted; a failed or cancelled import takes back what it wrote;
one whose process was SIGKILLed between its commands is deleted by the
recovery sweep when the runtime starts again.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from proc_groups import run_in_group

from actors.files.locations import DirectoryRules
from actors.runtime import DB_NAME, Runtime, RuntimeConfig
from actors.sessions import Sessions
from actors.transfer import SessionTransfer
from protocol import codec, ids
from protocol import events as ev
from protocol.cursor import SessionQuery
from protocol.errors import ConflictError, SessionNotFoundError
from protocol.requests import CreateSessionInput
from protocol.shapes import SessionExport
from storage import Command, SQLiteStore, rebuild_projections

ROOT = Path(__file__).resolve().parents[2]
#: Events per command in these tests: 7 messages make three commands.
CHUNK = 3
MESSAGES = 7


class Gate:
    """The transfer's ``blocking`` runner, parked before the command of chunk ``at``
    (0-based) is made: every chunk before it has committed by then."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.reached = asyncio.Event()
        self.go = asyncio.Event()

    async def parked(self, importing: asyncio.Future[Any]) -> None:
        """Until the import is parked at the gate (it failing or finishing first fails)."""
        reached = asyncio.ensure_future(self.reached.wait())
        await asyncio.wait([reached, importing], return_when=asyncio.FIRST_COMPLETED)
        if not reached.done():
            reached.cancel()
            await importing
            raise AssertionError("the import went in one command")

    async def __call__(self, fn: Callable[..., Any], *args: Any) -> Any:
        if isinstance(fn, functools.partial) and fn.func == Command.of:
            expected = fn.keywords["expected"] or {}
            if sum(expected.values()) > 0 and not self.go.is_set():
                self.reached.set()
                await self.go.wait()
        return await asyncio.to_thread(fn, *args)


async def _document(
    store: Any, sessions: Sessions, transfer: SessionTransfer, sid: str
) -> SessionExport:
    source = await sessions.create(CreateSessionInput(title="source"))
    for n in range(MESSAGES):
        event = ev.SyntheticRecorded(
            session_id=source.id, message_id=ids.message_id(), text=f"message {n}"
        )
        await store.append(Command.of(event))
    info = codec.to_json((await transfer.export(source.id)).info)
    info["id"] = sid
    exported = await transfer.export(source.id)
    assert len(exported.messages) == MESSAGES
    return SessionExport(
        info=codec.from_json(type(exported.info), info), messages=exported.messages
    )


def _transfer(store: Any, sessions: Sessions, blocking: Any = asyncio.to_thread) -> SessionTransfer:
    return SessionTransfer(
        store, sessions, directories=DirectoryRules(), blocking=blocking, chunk_events=CHUNK
    )


async def _listed(sessions: Sessions) -> set[str]:
    return {s.id for s in (await sessions.list(SessionQuery(limit=100))).data}


async def test_a_large_import_is_hidden_until_its_last_command_and_others_write_between(
    store: Any, sessions: Sessions
) -> None:
    plain = _transfer(store, sessions)
    document = await _document(store, sessions, plain, "ses_imported1")
    other = await sessions.create(CreateSessionInput(title="other"))
    gate = Gate(at=1)
    transfer = _transfer(store, sessions, gate)
    importing = asyncio.ensure_future(transfer.import_(document))
    await gate.parked(importing)

    # Its first command committed: the log holds it, no reader sees the session.
    assert await store.last_seq("ses_imported1") == CHUNK
    with pytest.raises(SessionNotFoundError):
        await sessions.get("ses_imported1")
    assert "ses_imported1" not in await _listed(sessions)
    assert await store.queries.session_count() == (2, 0)  # the source and the other
    assert await store.queries.imports() == [("ses_imported1", CHUNK)]
    # Another session's append commits while the import is under way.
    [between] = await store.append(
        Command.of(ev.SessionRenamed(session_id=other.id, title="between"))
    )

    gate.go.set()
    imported = await importing
    assert imported.id == "ses_imported1"
    assert "ses_imported1" in await _listed(sessions)
    assert len((await transfer.export("ses_imported1")).messages) == MESSAGES
    assert await store.queries.imports() == []
    records = await store.read("ses_imported1")
    assert [r.type.rsplit(".", 1)[0] for r in (records[0], records[-1])] == [
        "session.import.started",
        "session.import.finished",
    ]
    assert records[0].position < between.position < records[-1].position
    if isinstance(store, SQLiteStore):
        stored, rebuilt = rebuild_projections(str(store.path))
        assert stored == rebuilt


async def test_a_small_import_is_one_command_as_before(store: Any, sessions: Sessions) -> None:
    transfer = SessionTransfer(
        store, sessions, directories=DirectoryRules(), blocking=asyncio.to_thread
    )
    document = await _document(store, sessions, transfer, "ses_small1")
    await transfer.import_(document)
    records = await store.read("ses_small1")
    assert records[0].type == "session.created.1"
    assert len({r.position for r in records}) == len(records) == MESSAGES + 1


@pytest.mark.parametrize("how", ["conflict", "cancel"])
async def test_an_import_that_stops_midway_takes_back_what_it_wrote(
    store: Any, sessions: Sessions, how: str
) -> None:
    document = await _document(store, sessions, _transfer(store, sessions), "ses_stopped1")
    gate = Gate(at=1)
    transfer = _transfer(store, sessions, gate)
    importing = asyncio.ensure_future(transfer.import_(document))
    await gate.parked(importing)
    if how == "conflict":
        # Something else wrote the hidden session: the next command's expected
        # seq no longer holds.
        await store.append(Command.of(ev.SessionRenamed(session_id="ses_stopped1", title="x")))
        gate.go.set()
        with pytest.raises(ConflictError):
            await importing
    else:
        importing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await importing
    assert await store.queries.imports() == []
    assert await store.fetch("SELECT count(*) FROM session WHERE id = 'ses_stopped1'") == [(0,)]
    assert await store.fetch(
        "SELECT count(*) FROM session_message WHERE session_id = 'ses_stopped1'"
    ) == [(0,)]
    assert [r.type for r in await store.read("ses_stopped1")][-1] == "session.deleted.2"


_CHILD = """
import asyncio, functools, os, signal, sys
import orjson
from actors.files.locations import DirectoryRules
from actors.sessions import Sessions
from actors.transfer import SessionTransfer
from protocol import codec
from protocol.shapes import SessionExport
from storage import Command, SQLiteStore

async def main(db, doc):
    async with SQLiteStore(db) as store:
        sessions = Sessions(store, default_directory="/")
        async def blocking(fn, *args):
            if isinstance(fn, functools.partial) and fn.func == Command.of:
                if sum((fn.keywords["expected"] or {}).values()) > 0:
                    os.kill(os.getpid(), signal.SIGKILL)  # the first command is in
            return await asyncio.to_thread(fn, *args)
        transfer = SessionTransfer(
            store, sessions, directories=DirectoryRules(), blocking=blocking, chunk_events=3
        )
        data = orjson.loads(open(doc, "rb").read())
        await transfer.import_(codec.from_json(SessionExport, data))

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


@pytest.mark.sqlite_only
async def test_an_import_killed_between_commands_is_hidden_then_deleted_at_start(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    db = data / DB_NAME
    async with SQLiteStore(db) as store:
        sessions = Sessions(store, default_directory=str(tmp_path))
        document = await _document(store, sessions, _transfer(store, sessions), "ses_killed1")
    doc = tmp_path / "doc.json"
    doc.write_bytes(orjson.dumps(codec.to_json(document)))
    child = await asyncio.to_thread(
        functools.partial(
            run_in_group,
            [sys.executable, "-c", _CHILD, str(db), str(doc)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            timeout=120,
        )
    )
    assert child.returncode == -signal.SIGKILL, child.stderr

    async with SQLiteStore(db) as store:
        # The first command is in the log; no reader sees the session.
        assert await store.last_seq("ses_killed1") == CHUNK
        assert await store.queries.session("ses_killed1") is None
        assert await store.queries.imports() == [("ses_killed1", CHUNK)]

    config = RuntimeConfig(data_dir=data, default_directory=str(tmp_path))
    async with Runtime(config) as runtime:
        # The start's recovery sweep deleted it.
        assert await runtime.store.queries.imports() == []
        assert await runtime.store.fetch(
            "SELECT count(*) FROM session_message WHERE session_id = 'ses_killed1'"
        ) == [(0,)]
        listed = await runtime.sessions.list(SessionQuery(limit=100))
        assert "ses_killed1" not in {s.id for s in listed.data}
    stored, rebuilt = rebuild_projections(str(db))
    assert stored == rebuilt
