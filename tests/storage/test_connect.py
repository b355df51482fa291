"""storage.connect: the one factory, choosing the backend by the ``database`` setting."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from protocol import Location
from protocol import events as ev
from storage import Command, StorageError, connect, host_channel, is_server_url


async def test_a_path_opens_a_sqlite_store_there(tmp_path: Path) -> None:
    db = tmp_path / "chosen.sqlite"
    async with connect(str(db), synchronous="NORMAL") as store:
        assert store.path == str(db)
        event = ev.SessionCreated(session_id="ses_a", title="t", location=Location(directory="/"))
        await store.append(Command.of(event))
        assert await store.last_seq("ses_a") == 1
    assert db.exists()
    async with connect(db, read_only=True) as again:
        assert again.read_only
        assert (await again.queries.session("ses_a")) is not None


def test_only_postgres_urls_name_a_server() -> None:
    assert is_server_url("postgresql://u@127.0.0.1/db")
    assert is_server_url("postgres://u@127.0.0.1/db")
    assert not is_server_url("/var/lib/sessionrt/sessionrt.sqlite")
    assert not is_server_url(Path("postgresql:"))


def test_a_postgres_url_without_the_driver_fails_in_a_sentence_without_the_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # asyncpg is an optional extra: without it the backend cannot load.
    for name in [
        m for m in sys.modules if m == "storage.postgres" or m.startswith("storage.postgres.")
    ]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "asyncpg", None)
    for make in (connect, host_channel):
        with pytest.raises(StorageError, match="PostgreSQL backend is not available") as info:
            make("postgresql://alice:hunter2@127.0.0.1/db")
        assert "hunter2" not in str(info.value)
        assert "alice:***@127.0.0.1/db" in str(info.value)
        assert "asyncpg is missing" in str(info.value)


def test_a_host_channel_is_for_hosts_sharing_a_server_not_a_file(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="needs a database server"):
        host_channel(str(tmp_path / "log.sqlite"))


def test_an_empty_database_is_refused_not_a_temporary_file() -> None:
    with pytest.raises(StorageError, match="database is empty"):
        connect("")


def test_an_unknown_scheme_is_refused() -> None:
    with pytest.raises(StorageError, match="unknown scheme 'mysql'"):
        connect("mysql://127.0.0.1/db")


async def test_the_runtime_keeps_its_log_where_the_database_setting_says(tmp_path: Path) -> None:
    from actors.runtime import Runtime
    from protocol.requests import CreateSessionInput
    from server.config import load_config, runtime_config

    elsewhere = tmp_path / "elsewhere" / "log.sqlite"
    elsewhere.parent.mkdir()
    toml = tmp_path / "sessionrt.toml"
    toml.write_text(f'[runtime]\ndatabase = "{elsewhere}"\nsynchronous = "NORMAL"\n')
    config = runtime_config(load_config(toml), tmp_path / "data", fallback_data_dir=tmp_path)
    assert config.database == str(elsewhere)
    async with Runtime(config) as rt:
        s = await rt.sessions.create(CreateSessionInput(title="where"))
    assert elsewhere.exists()
    assert not config.db_path.exists()
    async with connect(elsewhere, read_only=True) as store:
        found = await store.queries.session(s.id)
        assert found is not None
        assert found.title == "where"
