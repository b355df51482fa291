"""``sessionrt export SESSION > FILE`` and ``sessionrt import FILE``: through the CLI's
``main`` in-process (tests/cli_inprocess.py), and each once as a real subprocess."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import cli_inprocess
from proc_groups import kill_group

from actors.runtime import Runtime, RuntimeConfig
from protocol.requests import CreateSessionInput, PromptInput

EXE = str(Path(sys.executable).with_name("sessionrt"))
TIMEOUT = 30


async def sessionrt_process(*args: str) -> tuple[int | None, str, str]:
    """The console script end to end, in a process (and process group) of its own."""
    proc = await asyncio.create_subprocess_exec(
        EXE,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT)
    finally:
        kill_group(proc)
    assert b"Traceback" not in err, err.decode()
    return proc.returncode, out.decode(), err.decode()


async def sessionrt(*args: str) -> tuple[int | None, str, str]:
    done = await cli_inprocess.sessionrt(*args)
    return done.code, done.out, done.err


async def test_export_then_import_into_another_data_dir(tmp_path: Path) -> None:
    source = tmp_path / "source"
    config = RuntimeConfig(data_dir=source, default_directory=str(tmp_path))
    async with Runtime(config) as rt:
        s = await rt.sessions.create(CreateSessionInput(title="moving house"))
        await rt.sessions.prompt(s.id, PromptInput(text="#text carried over"))
        await rt.execution.wait_idle(s.id)

    code, out, err = await sessionrt_process("export", s.id, "--data-dir", str(source))
    assert code == 0, err
    document = json.loads(out)
    assert document["info"]["id"] == s.id
    assert [m["type"] for m in document["messages"]] == ["user", "assistant"]
    file = tmp_path / "session.json"
    file.write_text(out)

    target = tmp_path / "target"
    code, out, err = await sessionrt_process("import", str(file), "--data-dir", str(target))
    assert code == 0, err
    assert out.strip() == s.id
    code, out, err = await sessionrt("export", s.id, "--data-dir", str(target))
    assert code == 0, err
    copy = json.loads(out)
    assert copy["info"]["title"] == "moving house"
    texts = [m.get("text") or m["parts"][0]["text"] for m in copy["messages"]]
    assert texts == ["#text carried over", "carried over"]

    # Again into the same place: the id is taken.
    code, out, err = await sessionrt("import", str(file), "--data-dir", str(target))
    assert code == 1
    assert "ConflictError" in err
    code, out, err = await sessionrt("export", "ses_nope", "--data-dir", str(target))
    assert code == 1
    assert "not found" in err
    code, out, err = await sessionrt(
        "import", str(tmp_path / "absent.json"), "--data-dir", str(target)
    )
    assert code == 1
    assert "cannot read" in err
    (tmp_path / "garbage.json").write_text("{not json")
    code, out, err = await sessionrt(
        "import", str(tmp_path / "garbage.json"), "--data-dir", str(target)
    )
    assert code == 1
    assert "InvalidRequestError" in err
