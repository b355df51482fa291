"""``crashsim --hosts 3 --database postgresql://…``: a short real run passes.

Three real server processes on one PostgreSQL database (created and dropped
here), SIGKILL, SIGSTOP and the server ending every connection at random; the
script's own checks are the assertions (see ``scripts/_crashsim_hosts.py``),
and no request got a 500 (a 503 while the database is away is the answer).
"""

from __future__ import annotations

import importlib.util
import json
import secrets
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from proc_groups import run_in_group

#: Real servers started and killed: first, so they do not end the run alone.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "crashsim.py"
SERVER = "postgresql://postgres@127.0.0.1:5432"

if importlib.util.find_spec("storage.postgres") is None:
    pytest.skip("this build has no PostgreSQL backend", allow_module_level=True)
asyncpg = pytest.importorskip("asyncpg")


@pytest.fixture
async def database() -> AsyncIterator[str]:
    name = f"crashsim_{secrets.token_hex(6)}"
    admin = await asyncpg.connect(f"{SERVER}/postgres")
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        yield f"{SERVER}/{name}"
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


def test_three_hosts_with_kills_and_pauses_keep_the_invariants(database: str) -> None:
    done = run_in_group(
        [
            sys.executable,
            str(SCRIPT),
            *("--hosts", "3", "--database", database, "--duration", "5"),
            *("--sessions", "3", "--seed", "11", "--lease-ttl-ms", "1200", "--json"),
        ],
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["violations"] == []
    assert report["kills"] + report["stops"] + report["connection_drops"] >= 1
    assert [n for n in report["notes"] if n.endswith(": 500")] == []
    assert report["receipts"] > 0
    assert report["followed_events"] > 0
    # A clean run without --keep leaves no data directory behind.
    assert report["data_dir"] is None
