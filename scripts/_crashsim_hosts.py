"""``crashsim --hosts N --database postgresql://…``: several servers on one database.

N ``sessionrt serve`` processes share one PostgreSQL database (short leases,
``lease_ttl_ms`` from ``--lease-ttl-ms``). A random workload goes to random
running hosts: prompts with ids (half of them run a bash call that appends a
mark to a ledger), interrupts, resumes. At random a host is SIGKILLed (and a
new one started in its place) or SIGSTOPped past its lease ttl and then
SIGCONTed, or the database server ends every connection to the database
(``pg_terminate_backend``, as a restart or a failover does: each host's
writers, readers, log listener and host channel at once). A follower per
session reads the session's SSE log from a random host and moves to another
when its host goes away, resuming after the last seq it saw. After a settle
(every host running, no claim left) the checks:

- every prompt with a receipt was enqueued once, and delivered or cancelled
  once, or is still pending (an interrupt without resume leaves it queued);
- no session was written under an epoch older than one already written, and
  each epoch has one host (:func:`crashsim.check_fences`, on ``event_fence``);
- no tool call ran twice (each ledger mark once);
- every claim ended;
- every follower saw seq 1, 2, 3 … without a gap or a repeat, across hosts.

Prints a report (or JSON with ``--json``) and exits 1 on any violation.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
from _children import die_with_parent

START_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 5.0


class Host:
    """One ``sessionrt serve`` process on the shared database."""

    def __init__(self, exe: Path, root: Path, database: str, ttl_ms: int, index: int) -> None:
        self.index = index
        self.host_id = f"host-{index}"
        data = root / self.host_id
        data.mkdir(parents=True, exist_ok=True)
        config = data / "config.toml"
        config.write_text(
            f'[runtime]\nhost_id = "{self.host_id}"\nlease_ttl_ms = {ttl_ms}\n'
            f'database = "{database}"\n'
        )
        env = {k: v for k, v in os.environ.items() if k != "SESSIONRT_SERVER_PASSWORD"}
        self.log = (root / f"{self.host_id}.log").open("ab")
        self.proc = subprocess.Popen(
            die_with_parent(  # a killed harness takes its servers
                [str(exe), "serve", "--port", "0", "--data-dir", str(data), "--config", str(config)]
            ),
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self.log,
        )
        self.url: str | None = None
        self.stopped = False

    async def listening(self) -> str:
        assert self.proc.stdout is not None
        stdout = self.proc.stdout

        def first_line() -> str:
            for raw in stdout:
                line = raw.decode(errors="replace").strip()
                if " listening on " in line:
                    return line.rsplit(" ", 1)[-1]
            raise RuntimeError(f"{self.host_id} exited before listening")

        self.url = await asyncio.wait_for(asyncio.to_thread(first_line), START_TIMEOUT_S)
        # Keep draining stdout so the server never blocks on a full pipe.
        threading_drain(stdout)
        return self.url

    @property
    def running(self) -> bool:
        return self.proc.poll() is None and not self.stopped and self.url is not None

    # Signals go through Popen.send_signal, which does nothing once the process
    # has been reaped (``running`` polls): ``os.kill`` on a reaped pid could hit
    # whatever process the kernel gave that number next.
    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.log.close()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)
        self.stopped = True

    def cont(self) -> None:
        self.proc.send_signal(signal.SIGCONT)
        self.stopped = False


def threading_drain(stream: Any) -> None:
    import threading

    threading.Thread(target=lambda: [None for _ in stream], daemon=True).start()


class HostSim:
    def __init__(self, args: Any, exe: Path, root: Path, load: Any) -> None:
        self.args = args
        self.exe = exe
        self.root = root
        self.rng = random.Random(args.seed)
        self.crashsim = load
        self.hosts: list[Host] = []
        self.serial = 0
        self.sessions: list[str] = []
        self.receipts: list[tuple[str, str]] = []
        self.seen: dict[str, list[int]] = {}
        self.kills = 0
        self.stops = 0
        self.drops = 0
        self.ledger = root / "ledger.txt"
        self.notes: list[str] = []

    async def start_host(self) -> Host:
        host = Host(self.exe, self.root, self.args.database, self.args.lease_ttl_ms, self.serial)
        self.serial += 1
        await host.listening()
        self.hosts.append(host)
        return host

    def live(self) -> list[Host]:
        return [h for h in self.hosts if h.running]

    async def call(
        self, http: aiohttp.ClientSession, method: str, path: str, body: Any = None
    ) -> Any:
        live = self.live()
        if not live:
            return None
        host = self.rng.choice(live)
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                async with http.request(method, f"{host.url}{path}", json=body) as response:
                    if response.status >= 500:
                        self.notes.append(f"{method} {path} on {host.host_id}: {response.status}")
                    return await response.json() if response.status < 300 else None
        except (TimeoutError, aiohttp.ClientError):
            return None  # the host went away mid-request: no receipt

    async def follow(self, http: aiohttp.ClientSession, sid: str, done: asyncio.Event) -> None:
        seqs = self.seen.setdefault(sid, [])
        while not done.is_set():
            live = self.live()
            if not live:
                await asyncio.sleep(0.1)
                continue
            host = self.rng.choice(live)
            after = seqs[-1] if seqs else 0
            try:
                async with http.get(
                    f"{host.url}/api/session/{sid}/event?after={after}",
                    timeout=aiohttp.ClientTimeout(total=None, sock_read=2),
                ) as response:
                    async for raw in response.content:
                        line = raw.decode().strip()
                        if line.startswith("id: "):
                            seqs.append(int(line[4:]))
                        if done.is_set():
                            return
            except (TimeoutError, aiohttp.ClientError, ValueError):
                pass  # its host stopped or died: move to another
            await asyncio.sleep(0.05)

    async def workload(self, http: aiohttp.ClientSession, until: float) -> None:
        step = 0
        while time.monotonic() < until:
            step += 1
            sid = self.rng.choice(self.sessions)
            roll = self.rng.random()
            if roll < 0.7:
                item = f"msg_{os.urandom(12).hex()}"
                if self.rng.random() < 0.5:
                    mark = f"M{step}"
                    command = f"echo {mark} >> {self.ledger}; sleep 0.2"
                    text = f"#tool bash {json.dumps({'command': command})}"
                else:
                    text = f"#text answer {step}"
                got = await self.call(
                    http, "POST", f"/api/session/{sid}/prompt", {"id": item, "text": text}
                )
                if got is not None:
                    self.receipts.append((sid, item))
            elif roll < 0.85:
                await self.call(http, "POST", f"/api/session/{sid}/interrupt")
            await asyncio.sleep(self.rng.uniform(0.0, 0.1))

    async def faults(self, until: float) -> None:
        ttl = self.args.lease_ttl_ms / 1000
        while time.monotonic() < until:
            await asyncio.sleep(self.rng.uniform(ttl * 0.5, ttl * 1.5))
            live = self.live()
            if len(live) < 2:
                continue
            victim = self.rng.choice(live)
            roll = self.rng.random()
            if roll < 0.2:
                await self.drop_connections()
            elif roll < 0.6:
                victim.kill()
                self.kills += 1
                self.hosts.remove(victim)
                await self.start_host()
            else:
                victim.stop()
                self.stops += 1
                await asyncio.sleep(ttl * 1.5)  # past its lease: others take its sessions
                victim.cont()

    async def drop_connections(self) -> None:
        """End every server session on the database but this one, as a restart would."""
        import asyncpg

        conn = await asyncpg.connect(self.args.database)
        try:
            ended = await conn.fetch(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        finally:
            await conn.close()
        if ended:
            self.drops += 1

    async def run(self) -> list[Any]:
        for _ in range(self.args.hosts):
            await self.start_host()
        async with aiohttp.ClientSession() as http:
            for _ in range(self.args.sessions):
                got = await self.call(http, "POST", "/api/session", {})
                if got is not None:
                    self.sessions.append(got["data"]["id"])
            done = asyncio.Event()
            followers = [asyncio.create_task(self.follow(http, s, done)) for s in self.sessions]
            until = time.monotonic() + self.args.duration
            await asyncio.gather(self.workload(http, until), self.faults(until))
            for host in self.hosts:
                if host.stopped:
                    host.cont()
            settled = await self.settle()
            await asyncio.sleep(0.5)  # the followers' last frames
            done.set()
            for task in followers:
                task.cancel()
            await asyncio.gather(*followers, return_exceptions=True)
        violations = await self.check(settled)
        for host in self.hosts:
            host.kill()
        return violations

    async def settle(self) -> bool:
        import asyncpg

        conn = await asyncpg.connect(self.args.database)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                claimed = await conn.fetchval(
                    "SELECT count(*) FROM session WHERE time_claimed IS NOT NULL"
                )
                if claimed == 0:
                    return True
                await asyncio.sleep(0.2)
            return False
        finally:
            await conn.close()

    async def check(self, settled: bool) -> list[Any]:
        import asyncpg

        violation = self.crashsim.Violation
        out: list[Any] = []
        conn = await asyncpg.connect(self.args.database)
        try:
            if not settled:
                out.append(violation("claim.unreleased", "claims left after 60 s of settling"))
            for sid, item in self.receipts:
                counts = {}
                for kind in ("enqueued", "delivered", "cancelled"):
                    counts[kind] = await conn.fetchval(
                        "SELECT count(*) FROM event WHERE aggregate_id = $1 AND type LIKE $2"
                        " AND data::jsonb ->> 'inboxID' = $3",
                        sid,
                        f"session.inbox.{kind}.%",
                        item,
                    )
                answered = counts["delivered"] + counts["cancelled"]
                pending = await conn.fetchval(
                    "SELECT count(*) FROM session_inbox WHERE id = $1", item
                )
                if counts["enqueued"] != 1:
                    out.append(violation("admission.count", f"{item}: enqueued {counts}"))
                elif answered > 1 or (answered == 0 and pending != 1):
                    # Still pending is fine (an interrupt without resume leaves
                    # input queued); lost or answered twice is not.
                    out.append(violation("admission.answer", f"{item}: {counts}, {pending=}"))
            rows = await conn.fetch(
                "SELECT session_id, position, host_id, epoch FROM event_fence"
                " ORDER BY session_id, position"
            )
            out += self.crashsim.fences_violations([tuple(r) for r in rows])
            heads = {
                r[0]: int(r[1])
                for r in await conn.fetch(
                    "SELECT aggregate_id, max(seq) FROM event GROUP BY aggregate_id"
                )
            }
        finally:
            await conn.close()
        marks = self.ledger.read_text().split() if self.ledger.exists() else []
        for mark in sorted({m for m in marks if marks.count(m) > 1}):
            out.append(violation("tool.executed-twice", f"{mark}: {marks.count(mark)} times"))
        for sid, seqs in self.seen.items():
            if seqs != list(range(1, len(seqs) + 1)):
                out.append(violation("follow.gap", f"{sid}: saw {_runs(seqs)}"))
            elif seqs and seqs[-1] != heads.get(sid):
                out.append(
                    violation("follow.behind", f"{sid}: saw up to {seqs[-1]} of {heads.get(sid)}")
                )
        return out


def _runs(seqs: Sequence[int]) -> str:
    return ",".join(str(s) for s in seqs[:40]) + ("…" if len(seqs) > 40 else "")


def main(args: Any, exe: Path, load: Any) -> int:
    root = Path(tempfile.mkdtemp(prefix="crashsim-hosts-"))
    sim = HostSim(args, exe, root, load)
    started = time.monotonic()
    try:
        violations = asyncio.run(sim.run())
    finally:
        for host in sim.hosts:
            if host.proc.poll() is None:
                host.kill()
    report = {
        "hosts": args.hosts,
        "seed": args.seed,
        "sessions": len(sim.sessions),
        "receipts": len(sim.receipts),
        "kills": sim.kills,
        "stops": sim.stops,
        "connection_drops": sim.drops,
        "followed_events": sum(len(s) for s in sim.seen.values()),
        "elapsed_s": round(time.monotonic() - started, 2),
        "notes": sim.notes,
        # Kept for a look when asked (--keep) or when the run found something.
        "data_dir": str(root) if args.keep or violations else None,
        "violations": [{"check": v.check, "detail": v.detail} for v in violations],
    }
    if report["data_dir"] is None:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            if key != "violations":
                print(f"  {key}: {value}")
        for v in report["violations"]:
            print(f"    [{v['check']}] {v['detail']}")
        print("PASS" if not violations else "FAIL")
    sys.stdout.flush()
    return 0 if not violations else 1
