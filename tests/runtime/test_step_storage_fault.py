"""A step whose appends fail because the database does: one warning line, no traceback.

The fault is real: the process's file-size limit (``RLIMIT_FSIZE``) is lowered
to the size of the log's write-ahead file once the step started, so SQLite's next
write really fails (EFBIG, the same path as a full disk).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import resource
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from feed import Feed

from actors.runtime import Runtime
from protocol.requests import PromptInput


@contextlib.contextmanager
def _no_growth(wal: Path) -> Iterator[None]:
    """No file this process writes may grow past the log's write-ahead file."""
    limit = wal.stat().st_size
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG, not a core dump
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, old_limit[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)


@pytest.mark.sqlite_only  # the fault is a file that may not grow
async def test_a_step_cut_off_by_the_database_logs_one_line(
    runtime: Runtime, feed: Feed, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    s = await runtime.sessions.create()
    command = {"command": f"sleep 0.3; echo {os.urandom(30_000).hex()}"}
    await runtime.sessions.prompt(s.id, PromptInput(text=f"#tool bash {json.dumps(command)}"))
    await feed.wait("session.tool.called", sessionID=s.id)
    with _no_growth(tmp_path / "data" / "sessionrt.sqlite-wal"):
        with contextlib.suppress(Exception):
            await runtime.execution.wait_idle(s.id)
        records = [r for r in caplog.records if r.name == "actors.session.step"]
    assert [r.getMessage().split(":")[0] for r in records] == [f"step of {s.id} stopped"]
    assert records[0].levelno == logging.WARNING
    assert records[0].exc_info is None
    assert "failed unexpectedly" not in caplog.text
