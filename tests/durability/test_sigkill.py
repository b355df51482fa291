"""A receipt means durable: SIGKILL right after it, and the prompt is still there."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path

import orjson
import pytest

from actors.sessions import Sessions
from protocol import InboxItem, codec
from storage import SQLiteStore, rebuild_projections

#: Real processes started and killed: first, so they do not end the run alone.
pytestmark = pytest.mark.slow

CHILD = """
import asyncio, os, sys
import orjson
from actors.sessions import Sessions
from protocol import codec
from protocol.requests import CreateSessionInput, PromptInput
from storage import SQLiteStore

async def main(path):
    async with SQLiteStore(path) as store:
        sessions = Sessions(store, default_directory=os.path.dirname(path))
        session = await sessions.create(CreateSessionInput(id="ses_durable"))
        i = 0
        while True:
            receipt = await sessions.prompt(session.id, PromptInput(text=f"prompt {i}"))
            # The receipt is printed only once admission has committed.
            sys.stdout.buffer.write(orjson.dumps(codec.to_json(receipt)) + b"\\n")
            sys.stdout.flush()
            i += 1

asyncio.run(main(sys.argv[1]))
"""


async def test_prompt_survives_sigkill_after_its_receipt(db_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CHILD,
        str(db_path),
        stdout=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout is not None
    receipts: list[InboxItem] = []
    try:
        async with asyncio.timeout(30):
            while len(receipts) < 25:
                line = await proc.stdout.readline()
                assert line, "child exited early"
                receipts.append(codec.from_json(InboxItem, orjson.loads(line)))
        # Kill mid-stream: the child is admitting the next prompt right now.
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
    assert proc.returncode == -signal.SIGKILL

    async with SQLiteStore(db_path) as store:
        pending = await Sessions(store).pending("ses_durable")
        by_id = {item.id: item for item in pending}
        for receipt in receipts:
            assert by_id[receipt.id] == receipt
        seqs = [r.seq for r in await store.read("ses_durable", limit=10_000)]
        assert seqs == list(range(1, len(seqs) + 1))
    stored, rebuilt = await asyncio.to_thread(rebuild_projections, str(db_path))
    assert stored == rebuilt
