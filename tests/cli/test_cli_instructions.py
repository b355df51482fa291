"""``sessionrt instructions SESSION [set KEY VALUE | rm KEY]``: through the CLI's ``main``
in-process (tests/cli_inprocess.py), and once as a real subprocess of the console script."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path

from cli_inprocess import Done, sessionrt
from proc_groups import kill_group

EXE = str(Path(sys.executable).with_name("sessionrt"))


async def sessionrt_process(*args: str) -> Done:
    proc = await asyncio.create_subprocess_exec(
        EXE,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        kill_group(proc)
    done = Done(proc.returncode, out.decode(), err.decode())
    assert "Traceback" not in done.err, done.err
    return done


async def test_set_list_rm_and_the_next_step_sees_it(tmp_path: Path) -> None:
    data = ["--data-dir", str(tmp_path / "data")]
    first = await sessionrt("run", "hello", *data)
    assert first.code == 0, first.err
    match = re.search(r"session (ses_\w+)", first.err)
    assert match, first.err
    sid = match.group(1)

    # The command end to end, once: the console script in a process of its own.
    assert (await sessionrt_process("instructions", sid, "set", "tone", "terse", *data)).code == 0
    assert (await sessionrt("instructions", sid, "set", "limits", '{"max": 2}', *data)).code == 0
    listed = await sessionrt("instructions", sid, *data)
    assert [json.loads(line) for line in listed.out.splitlines()] == [
        {"key": "limits", "value": {"max": 2}},
        {"key": "tone", "value": "terse"},
    ]
    assert (await sessionrt("instructions", sid, "rm", "limits", *data)).code == 0

    again = await sessionrt("run", "again", "--session", sid, *data)
    assert again.code == 0, again.err
    log = [json.loads(line) for line in (await sessionrt("log", sid, *data)).out.splitlines()]
    updates = [e["data"] for e in log if e.get("type") == "session.instructions.updated"]
    assert updates[-1]["delta"].keys() == {"api/tone"}
    assert '<context key="tone">\nterse\n</context>' in updates[-1]["text"]

    bad = await sessionrt("instructions", sid, "set", "Bad Key", "x", *data)
    assert bad.code == 1
    assert "InvalidRequestError" in bad.err
    usage = await sessionrt("instructions", sid, "frob", *data)
    assert usage.code == 1
    assert "set KEY VALUE" in usage.err
