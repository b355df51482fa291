"""Confinement probes for what a client hands in: attachments and session directories.

Real files, real symlinks, a real SQLite store; every refusal is a 400
``InvalidRequestError`` naming the field, and nothing is admitted.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from actors.files.locations import DirectoryRules
from actors.runtime import Runtime, RuntimeConfig
from actors.sessions import Sessions
from protocol.errors import InvalidRequestError
from protocol.requests import CreateSessionInput, FileInput, PromptInput
from protocol.shapes import Location, Session
from storage import SQLiteStore

SECRET = b"TOPSECRET-canary"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    path.mkdir()
    return path


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "secret.txt"
    path.write_bytes(SECRET)
    return path


async def attach(sessions: Sessions, session: Session, uri: str) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as raised:
        await sessions.prompt(
            session.id, PromptInput(text="x", files=(FileInput(uri=uri, mime="text/plain"),))
        )
    error = raised.value
    assert error.fields.get("kind") == "file"
    assert error.fields.get("field") == "files[0].uri"
    assert SECRET.decode() not in error.message
    assert await sessions.pending(session.id) == []
    return error


async def in_project(sessions: Sessions, project: Path) -> Session:
    return await sessions.create(CreateSessionInput(location=Location(directory=str(project))))


# -- attachments -----------------------------------------------------------------------------


@pytest.mark.parametrize("uri", ["file:///etc/passwd", "file:///proc/self/environ"])
async def test_system_files_are_refused(sessions: Sessions, project: Path, uri: str) -> None:
    error = await attach(sessions, await in_project(sessions, project), uri)
    assert "outside the session's directory" in error.message


async def test_dot_dot_is_judged_by_where_it_leads(
    sessions: Sessions, project: Path, outside: Path
) -> None:
    session = await in_project(sessions, project)
    await attach(sessions, session, f"file://{project}/../{outside.name}")
    await attach(sessions, session, f"file:../{outside.name}")
    await attach(sessions, session, f"file://{project}/%2e%2e/{outside.name}")


async def test_a_symlink_out_of_the_directory_is_refused(
    sessions: Sessions, project: Path, outside: Path
) -> None:
    (project / "innocent.txt").symlink_to(outside)
    (project / "dir").symlink_to(outside.parent)
    session = await in_project(sessions, project)
    await attach(sessions, session, (project / "innocent.txt").as_uri())
    await attach(sessions, session, f"file://{project}/dir/{outside.name}")


@pytest.mark.sqlite_only
async def test_the_database_is_refused_even_inside_the_directory(
    sessions: Sessions, store: SQLiteStore, tmp_path: Path
) -> None:
    # The store lives in tmp_path; a session there could otherwise attach it.
    session = await sessions.create(CreateSessionInput(location=Location(directory=str(tmp_path))))
    db = Path(store.path)
    assert db.parent == tmp_path
    for name in (db.name, db.name + "-wal", db.name + "-shm"):
        error = await attach(sessions, session, (tmp_path / name).as_uri())
        assert "belongs to the server" in error.message
    (tmp_path / "db-link").symlink_to(db)
    await attach(sessions, session, (tmp_path / "db-link").as_uri())


async def test_the_data_dir_is_refused_even_inside_the_directory(
    store: SQLiteStore, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "agents.toml").write_bytes(SECRET)
    sessions = Sessions(store, directories=DirectoryRules(data_dir=data))
    session = await sessions.create(CreateSessionInput(location=Location(directory=str(tmp_path))))
    error = await attach(sessions, session, (data / "agents.toml").as_uri())
    assert "belongs to the server" in error.message


async def test_special_files_and_remote_hosts_are_refused(
    sessions: Sessions, project: Path
) -> None:
    os.mkfifo(project / "pipe")  # reading it would block the admission forever
    session = await in_project(sessions, project)
    error = await attach(sessions, session, (project / "pipe").as_uri())
    assert "not a regular file" in error.message
    await attach(sessions, session, "file://elsewhere.example/etc/hostname")
    await attach(sessions, session, "file://" + str(project) + "/%00x")
    await attach(sessions, session, (project / "missing.txt").as_uri())


async def test_a_file_inside_the_directory_is_accepted(
    sessions: Sessions, project: Path, outside: Path
) -> None:
    (project / "sub").mkdir()
    (project / "sub" / "notes.txt").write_bytes(b"inside")
    (project / "link.txt").symlink_to(project / "sub" / "notes.txt")  # a link that stays inside
    session = await in_project(sessions, project)
    for uri in (
        (project / "sub" / "notes.txt").as_uri(),
        (project / "link.txt").as_uri(),
        "file:sub/notes.txt",
        f"file://localhost{project}/sub/../sub/notes.txt",
    ):
        receipt = await sessions.prompt(
            session.id, PromptInput(text="x", files=(FileInput(uri=uri, mime="text/plain"),))
        )
        assert base64.b64decode(receipt.payload["files"][0]["data"]) == b"inside"


# -- session directories ---------------------------------------------------------------------


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    path = tmp_path / "data"
    (path / "tool-output").mkdir(parents=True)
    return path


@pytest.fixture
def ruled(store: SQLiteStore, data_dir: Path, project: Path) -> Sessions:
    return Sessions(
        store, default_directory=str(project), directories=DirectoryRules(data_dir=data_dir)
    )


def refused_directories(tmp_path: Path, data_dir: Path) -> list[str]:
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "to-root").symlink_to("/")
    (tmp_path / "to-data").symlink_to(data_dir)
    return [
        str(tmp_path / "missing"),
        str(tmp_path / "a-file"),
        "/",
        str(tmp_path / "to-root"),
        str(data_dir),
        str(data_dir / "tool-output"),
        str(tmp_path / "to-data"),
        str(tmp_path) + "/\0x",
        "relative/dir",
    ]


async def test_refused_directories(ruled: Sessions, tmp_path: Path, data_dir: Path) -> None:
    for directory in refused_directories(tmp_path, data_dir):
        with pytest.raises(InvalidRequestError) as raised:
            await ruled.create(CreateSessionInput(location=Location(directory=directory)))
        assert raised.value.fields.get("field") == "location.directory", directory
    page = await ruled.list()
    assert not page.data


async def test_the_operator_can_allow_root_and_the_data_dir(
    store: SQLiteStore, data_dir: Path
) -> None:
    sessions = Sessions(
        store, directories=DirectoryRules(data_dir=data_dir, allowed=["/", data_dir])
    )
    for directory in ("/", str(data_dir)):
        s = await sessions.create(CreateSessionInput(location=Location(directory=directory)))
        assert s.location.directory == directory
    with pytest.raises(InvalidRequestError):  # allowing the data dir is not allowing below it
        await sessions.create(
            CreateSessionInput(location=Location(directory=str(data_dir / "tool-output")))
        )


async def test_the_default_directory_is_checked_at_create(
    store: SQLiteStore, tmp_path: Path
) -> None:
    sessions = Sessions(store, default_directory=str(tmp_path / "gone"))
    with pytest.raises(InvalidRequestError, match="does not exist"):
        await sessions.create()


@pytest.mark.parametrize("default", ["/", "missing", "data"])
async def test_a_runtime_refuses_to_start_on_a_bad_default(tmp_path: Path, default: str) -> None:
    data = tmp_path / "data"
    directory = {"/": "/", "missing": str(tmp_path / "missing"), "data": str(data)}[default]
    runtime = Runtime(RuntimeConfig(data_dir=data, default_directory=directory, recover=False))
    with pytest.raises(InvalidRequestError) as raised:
        async with runtime:
            pass
    assert raised.value.fields.get("field") == "runtime.default_directory"


async def test_a_runtime_allowed_root_starts_there(tmp_path: Path) -> None:
    config = RuntimeConfig(
        data_dir=tmp_path / "data", default_directory="/", allow_directories=["/"], recover=False
    )
    async with Runtime(config) as runtime:
        session = await runtime.sessions.create()
    assert session.location.directory == "/"
