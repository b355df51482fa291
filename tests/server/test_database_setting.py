"""``[runtime] database`` and ``serve --database``: PostgreSQL by URL, the password kept out."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.runtime import DB_NAME, Runtime, RuntimeConfig
from protocol.requests import CreateSessionInput
from server.cli import main
from server.config import load_config, runtime_config
from storage.postgres import PostgresStore


def test_the_file_names_the_database_and_the_repr_hides_its_password(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[runtime]\ndatabase = "postgresql://app:hunter2@db.internal:5433/rt"\n')
    config = runtime_config(load_config(path), None, fallback_data_dir=tmp_path)
    assert config.database == "postgresql://app:hunter2@db.internal:5433/rt"
    assert "hunter2" not in repr(config)
    assert "postgresql://app:***@db.internal:5433/rt" in repr(config)


def test_another_kind_of_url_is_refused_without_echoing_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["serve", "--data-dir", str(tmp_path), "--database", "mysql://app:hunter2@db/rt"])
    assert code != 0
    err = capsys.readouterr().err
    assert "unknown scheme 'mysql'" in err
    assert "hunter2" not in err


def test_an_unreachable_server_is_named_without_its_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = "postgresql://app:hunter2@127.0.0.1:1/rt"
    code = main(["serve", "--data-dir", str(tmp_path), "--database", url, "--port", "0"])
    assert code != 0
    err = capsys.readouterr().err
    assert "postgresql://app:***@127.0.0.1:1/rt" in err
    assert "hunter2" not in err


async def test_a_runtime_on_postgresql_keeps_no_sqlite_file(tmp_path: Path, pg_url: str) -> None:
    config = RuntimeConfig(data_dir=tmp_path / "data", database=pg_url)
    async with Runtime(config) as rt:
        assert isinstance(rt.store, PostgresStore)
        session = await rt.sessions.create(CreateSessionInput(title="on postgres"))
    assert not (tmp_path / "data" / DB_NAME).exists()
    # Another process (here: another store) on the same database sees it.
    async with PostgresStore(pg_url) as other:
        found = await other.queries.session(session.id)
    assert found is not None
    assert found.title == "on postgres"
