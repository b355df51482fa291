"""``sessionrt serve`` as a real subprocess on a free loopback port."""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from proc_groups import kill_group

EXE = str(Path(sys.executable).with_name("sessionrt"))


class Served:
    def __init__(self, proc: asyncio.subprocess.Process, url: str) -> None:
        self.proc = proc
        self.url = url


@contextlib.asynccontextmanager
async def serving(
    data_dir: Path, *args: str, guard_s: float = 60.0, **spawn: Any
) -> AsyncIterator[Served]:
    """Start serve with ``args``; yields once it prints where it listens; kills its
    process group after (tests/conftest.py's reap catches what an interrupt skips).

    ``spawn`` goes to :func:`asyncio.create_subprocess_exec` (stderr is a pipe
    unless given; stdout is always one, read for the address).
    """
    spawn.setdefault("stderr", asyncio.subprocess.PIPE)
    spawn.setdefault("start_new_session", True)  # killed with all it started, below
    proc = await asyncio.create_subprocess_exec(
        EXE,
        *("serve", "--port", "0", "--data-dir", str(data_dir), *args),
        stdout=asyncio.subprocess.PIPE,
        **spawn,
    )
    assert proc.stdout is not None
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), guard_s)).decode()
        match = re.search(r"http://\S+", line)
        assert match, line
        yield Served(proc, match.group(0))
    finally:
        if proc.returncode is None:  # not reaped: its pid still names its group
            kill_group(proc)
        await proc.wait()
