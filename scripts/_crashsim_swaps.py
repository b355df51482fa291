"""The ``symlink-revert`` kill mode of ``scripts/crashsim.py``: reverts across symlink swaps.

Issue 35: a step that turned a tracked symlink ``d -> ../V`` into a real
directory and wrote ``d/f`` made the restore check ``d`` out as the symlink
and then unlink ``d/f`` through it, outside the session's directory (with
``d`` pointing at the data dir: the live database).

Each such boot makes a fresh git work tree ``swap-<boot>`` beside the other
sessions' and a session in it, points ``d`` at the sibling ``outside``
directory or at the data dir (each holding a canary file ``f``), lets a bash
step swap ``d`` for a real directory holding ``f`` (and write ``e``), and
stages (then clears, or commits) a files revert of that step on a server
spawned with the revert test hook at a random point: killed there. After
every restart (and at the end) :meth:`Swaps.check` asks: are both canaries
and the database intact, and is each swap tree what its session's log says
(the revert staged: ``d`` the symlink again, no ``e``; else the real
directory with ``f`` and ``e``)?
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import json
import os
import random
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

OUTSIDE_CANARY: Final = b"outside canary\n"
DATA_CANARY: Final = b"data canary\n"


@dataclass
class SwapRun:
    session: str
    tree: Path
    target: str
    second: str


@dataclass
class Swaps:
    workdir: Path
    data_dir: Path
    runs: list[SwapRun] = field(default_factory=list)
    #: Kills per revert pause point; reverts staged across a swap.
    kills: collections.Counter[str] = field(default_factory=collections.Counter)
    reverts: int = 0

    def prepare(self) -> None:
        outside = self.workdir / "outside"
        outside.mkdir(exist_ok=True)
        (outside / "f").write_bytes(OUTSIDE_CANARY)
        (self.data_dir / "f").write_bytes(DATA_CANARY)

    async def trigger(
        self,
        client: Any,
        rng: random.Random,
        index: int,
        pause: tuple[str, Path],
        inputs: Any,
    ) -> list[asyncio.Task[Any]]:
        """Swap ``d`` in a fresh tree, then revert the swap until the hook pauses it."""
        if not (self.workdir / "outside" / "f").exists():
            await asyncio.to_thread(self.prepare)
        point, marker = pause
        tree = self.workdir / f"swap-{index}"
        await asyncio.to_thread(_git_tree, tree)
        target = rng.choice(["../outside", "../data"])
        session = await client.sessions.create(
            inputs.CreateSessionInput(
                title=f"crashsim swap {index}", location=inputs.Location(directory=str(tree))
            )
        )
        await _bash(client, inputs, session.id, f"ln -s {target} d")
        second = await _bash(
            client, inputs, session.id, "rm d && mkdir d && echo x > d/f && echo y > e"
        )
        self.runs.append(SwapRun(session=session.id, tree=tree, target=target, second=second))
        stage = inputs.RevertStageInput(message_id=second, files=True)

        async def revert() -> None:
            await client.sessions.revert_stage(session.id, stage)
            self.reverts += 1
            if point == "commit":
                await client.sessions.revert_commit(session.id)
            elif point.startswith("clear."):
                await client.sessions.revert_clear(session.id)

        task = asyncio.create_task(revert())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(30):
                for _ in itertools.count():
                    if marker.exists() or task.done():
                        break
                    await asyncio.sleep(0.01)
        if marker.exists():
            self.kills[point] += 1
        return [task]

    def check(self, conn: Any, events: Sequence[Any], when: str) -> list[tuple[str, str]]:
        """(kind, detail) for each thing a revert across a swap broke."""
        out: list[tuple[str, str]] = []
        if (self.data_dir / "f").exists() or self.runs:
            for path, canary in (
                (self.workdir / "outside" / "f", OUTSIDE_CANARY),
                (self.data_dir / "f", DATA_CANARY),
            ):
                have = path.read_bytes() if path.exists() else None
                if have != canary:
                    out.append(("swap.outside", f"{path} is {have!r} {when}"))
            db = self.data_dir / "sessionrt.sqlite"
            if not db.exists() or db.stat().st_size == 0:
                out.append(("swap.database", f"{db} is gone {when}"))
        for run in self.runs:
            last = None
            for e in events:
                if e.aggregate_id == run.session and e.type in (
                    "session.revert.staged",
                    "session.revert.cleared",
                    "session.revert.committed",
                ):
                    last = e.type
            reverted = last in ("session.revert.staged", "session.revert.committed")
            d, f, e_path = run.tree / "d", run.tree / "d" / "f", run.tree / "e"
            if reverted:
                ok = d.is_symlink() and os.readlink(d) == run.target and not e_path.exists()
            else:
                ok = (
                    d.is_dir()
                    and not d.is_symlink()
                    and f.read_bytes() == b"x\n"
                    and e_path.read_bytes() == b"y\n"
                )
            if not ok:
                state = "staged" if reverted else "not staged"
                out.append(
                    ("swap.files", f"{run.tree.name}: the log says {state}, files disagree {when}")
                )
        return out

    def report(self) -> dict[str, Any]:
        return {"swaps": len(self.runs), "reverts": self.reverts, "kills": dict(self.kills)}


async def _bash(client: Any, inputs: Any, session_id: str, command: str) -> str:
    text = "#tool bash " + json.dumps({"command": command}) + "\n#step\n#text ok"
    receipt = await client.sessions.prompt(session_id, inputs.PromptInput(text=text))
    await asyncio.wait_for(client.sessions.wait(session_id), 30)
    return str(receipt.id)


def _git_tree(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q"], cwd=path, check=True)
