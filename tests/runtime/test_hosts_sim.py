"""Three hosts on one log under a random workload, pauses and handovers.

The in-process twin of ``crashsim --hosts``: three runtimes share one real
SQLite store and one in-process host bus; prompts (some running a tool that
appends a line to a ledger), interrupts and resumes go to random hosts; at
random a host stops renewing its leases for longer than their ttl (as a
paused process would) and a host shuts down and a new one takes its place.
At the end every admitted input exists once and was delivered once, no tool
call ran twice, every claim ended, and no session was written under an epoch
older than one already written (:func:`crashsim.check_fences`).
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
from pathlib import Path
from types import ModuleType

from scripts_loader import load_script

from actors.host_messages import LocalHostBus
from actors.runtime import Runtime, RuntimeConfig
from protocol import ids
from protocol.requests import PromptInput
from storage import SQLiteStore

TTL_MS = 300


def _crashsim() -> ModuleType:
    return load_script("crashsim")


async def test_three_hosts_keep_the_invariants(tmp_path: Path) -> None:
    rng = random.Random(15)
    ledger = tmp_path / "ledger"
    bus = LocalHostBus()
    serial = iter(range(1000))
    async with SQLiteStore(tmp_path / "shared.sqlite") as store:

        async def start() -> Runtime:
            config = RuntimeConfig(
                data_dir=tmp_path / "data",
                default_directory=str(tmp_path),
                host_id=f"host-{next(serial)}",
                lease_ttl_ms=TTL_MS,
            )
            rt = Runtime(config, store=store, host_bus=bus)
            await rt.__aenter__()
            return rt

        hosts = [await start() for _ in range(3)]
        try:
            sessions = [(await hosts[0].sessions.create()).id for _ in range(4)]
            admitted: list[str] = []
            pauses: list[asyncio.Task[None]] = []

            async def pause(rt: Runtime) -> None:
                rt.leases.suspend()
                await asyncio.sleep(TTL_MS * 2 / 1000)
                rt.leases.suspend(False)

            for step in range(40):
                action = rng.random()
                host = rng.choice(hosts)
                sid = rng.choice(sessions)
                if action < 0.55:
                    item = ids.message_id()
                    mark = f"T{step}"
                    text = (
                        f'#tool bash {{"command": "echo {mark} >> {ledger}; sleep 0.1"}}'
                        if rng.random() < 0.5
                        else f"#text answer {step}"
                    )
                    await host.sessions.prompt(sid, PromptInput(id=item, text=text))
                    admitted.append(item)
                elif action < 0.65:
                    await host.interrupt(sid)
                elif action < 0.8 and not any(not p.done() for p in pauses):
                    pauses.append(asyncio.create_task(pause(host)))
                elif action < 0.9:
                    hosts.remove(host)
                    await host.aclose()  # hands its sessions over
                    hosts.append(await start())
                await asyncio.sleep(rng.uniform(0, 0.15))
            await asyncio.gather(*pauses)
            async with asyncio.timeout(60):
                while await store.queries.claims() or any(  # noqa: ASYNC110 (polls the database)
                    [await h.execution.active() for h in hosts]
                ):
                    await asyncio.sleep(0.05)
        finally:
            for rt in hosts:
                await rt.aclose()

    conn = sqlite3.connect(tmp_path / "shared.sqlite")
    try:
        assert _crashsim().check_fences(conn) == []
        epochs = conn.execute("SELECT count(DISTINCT host_id) FROM event_fence").fetchone()[0]
        assert epochs >= 3  # the work really moved between hosts
        for item in admitted:
            counts = [
                conn.execute(
                    f"SELECT count(*) FROM event WHERE type LIKE 'session.inbox.{kind}.%'"
                    " AND json_extract(data, '$.inboxID') = ?",
                    (item,),
                ).fetchone()[0]
                for kind in ("enqueued", "delivered")
            ]
            cancelled = conn.execute(
                "SELECT count(*) FROM event WHERE type LIKE 'session.inbox.cancelled.%'"
                " AND json_extract(data, '$.inboxID') = ?",
                (item,),
            ).fetchone()[0]
            assert counts[0] == 1, item
            assert counts[1] + cancelled == 1, item
        claimed = conn.execute("SELECT count(*) FROM session WHERE time_claimed IS NOT NULL")
        assert claimed.fetchone()[0] == 0
    finally:
        conn.close()
    marks = ledger.read_text().split() if ledger.exists() else []
    assert len(marks) == len(set(marks))  # no tool call ran twice
