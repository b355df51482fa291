"""``sessionrt run`` asks permission questions on the terminal (a real pty), or says how."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import sys
from pathlib import Path

from cli_inprocess import sessionrt

EXE = str(Path(sys.executable).with_name("sessionrt"))
GUARD = 30.0
AGENTS = '[agents.asker.permissions]\nbash = { "echo *" = "allow", "*" = "ask" }\n'


def _setup(tmp_path: Path) -> tuple[Path, Path]:
    data, project = tmp_path / "data", tmp_path / "project"
    data.mkdir(mode=0o700)
    project.mkdir()
    (data / "agents.toml").write_text(AGENTS)
    return data, project


def _script(*commands: str) -> str:
    calls = [f"#tool bash {json.dumps({'command': c})}\n#step" for c in commands]
    return "\n".join([*calls, "#text finished"])


async def _run_on_a_pty(data: Path, project: Path, prompt: str, answers: list[bytes]) -> str:
    """Run with stdin on a pty; answer each ``allow?`` with the next of ``answers``."""
    master, slave = pty.openpty()
    try:
        proc = await asyncio.create_subprocess_exec(
            EXE,
            *("run", prompt, "--agent", "asker", "--data-dir", str(data)),
            stdin=slave,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=project,
        )
        os.close(slave)
        slave = -1
        assert proc.stderr is not None
        assert proc.stdout is not None
        err = b""
        async with asyncio.timeout(GUARD):  # a guard, never the assertion
            while line := await proc.stderr.readline():
                err += line
                if b"allow?" in line:
                    os.write(master, answers.pop(0))
            out = await proc.stdout.read()
            assert await proc.wait() == 0, err.decode()
        assert not answers
        return err.decode() + out.decode()
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)


async def test_run_asks_on_the_terminal_and_applies_each_answer(tmp_path: Path) -> None:
    data, project = _setup(tmp_path)
    prompt = _script("touch once", "touch nope", "touch always", "touch always")
    # A nonsense answer is asked again; the fourth call is covered by "always".
    text = await _run_on_a_pty(data, project, prompt, [b"y\n", b"what\n", b"n\n", b"a\n"])
    assert (project / "once").exists()
    assert not (project / "nope").exists()
    assert (project / "always").exists()
    assert text.count("? permission bash for bash: touch") == 3
    assert "finished" in text


async def test_run_without_a_terminal_says_how_to_answer_and_runs_nothing(tmp_path: Path) -> None:
    """Through ``main`` in-process (stdin not a terminal, the project as working directory);
    the terminal itself is the subprocess test above."""
    data, project = _setup(tmp_path)
    args = ("run", _script("touch marker"), "--agent", "asker", "--data-dir", str(data))
    done = await sessionrt(*args, cwd=project)
    assert done.code == 1, done.err
    assert "Traceback" not in done.err
    assert "/permission/per_" in done.err
    assert '{"reply": "once" | "always" | "reject"}' in done.err
    assert not (project / "marker").exists()
