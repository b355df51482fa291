"""Nearby AGENTS.md: injected after a successful read, once per session per file, durably.

A real runtime on a real SQLite file; the scripted model reads and lists
by directive; a second runtime on the same data dir proves the "once"
survives a restart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from actors.instructions._sources import FileCache
from actors.instructions.nearby import nearby_files
from actors.runtime import Runtime, RuntimeConfig
from protocol.requests import PromptInput
from protocol.shapes import AssistantMessage, SyntheticMessage


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / ".git").mkdir(parents=True)
    (root / "AGENTS.md").write_text("Root rule.\n")  # ambient: never injected
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "sub" / "AGENTS.md").write_text("Sub rule: be brief.\n")
    (root / "sub" / "deeper" / "AGENTS.md").write_text("Deeper rule: tabs.\n")
    (root / "sub" / "deeper" / "code.py").write_text("print(1)\n")
    (root / "sub" / "notes.txt").write_text("notes\n")
    (root / "other").mkdir()
    (root / "other" / "file.txt").write_text("x\n")
    return root


def config(tmp_path: Path, project: Path, **kw: Any) -> RuntimeConfig:
    return RuntimeConfig(data_dir=tmp_path / "data", default_directory=str(project), **kw)


async def turn(rt: Runtime, sid: str, script: str) -> None:
    await rt.sessions.prompt(sid, PromptInput(text=f"{script}\n#step\n#text Done."))
    await rt.wait_idle(sid)


async def injected(rt: Runtime, sid: str) -> list[SyntheticMessage]:
    page = await rt.sessions.messages(sid, order="asc", limit=200)
    return [
        m
        for m in page.data
        if isinstance(m, SyntheticMessage) and (m.metadata or {}).get("notice") == "instructions"
    ]


async def test_a_read_injects_the_agents_md_files_toward_the_root_once(
    tmp_path: Path, project: Path
) -> None:
    async with Runtime(config(tmp_path, project)) as rt:
        sid = (await rt.sessions.create()).id
        await turn(rt, sid, '#tool read {"path": "sub/deeper/code.py"}')
        first = await injected(rt, sid)
        # Root side first; the Location's own AGENTS.md is ambient, not injected.
        assert [m.metadata["path"] for m in first if m.metadata] == [
            str(project / "sub" / "AGENTS.md"),
            str(project / "sub" / "deeper" / "AGENTS.md"),
        ]
        assert first[0].text == "Instructions from sub/AGENTS.md:\n\nSub rule: be brief.\n"
        assert first[1].description == "Instructions from sub/deeper/AGENTS.md"

        # Right after the call, before the step's next model request.
        history = await rt.sessions.context(sid)
        kinds = [type(m).__name__ for m in history]
        at = kinds.index("SyntheticMessage")
        assert isinstance(history[at - 1], AssistantMessage)
        assert history[at - 1].parts[-1].type == "tool"

        # Again in the same directories, or reading a file elsewhere: nothing more.
        await turn(rt, sid, '#tool read {"path": "sub/notes.txt"}')
        await turn(rt, sid, '#tool list {"path": "sub/deeper"}')
        await turn(rt, sid, '#tool read {"path": "other/file.txt"}')
        assert len(await injected(rt, sid)) == 2

        # Another session gets its own.
        other = (await rt.sessions.create()).id
        await turn(rt, other, '#tool list {"path": "sub"}')
        assert [m.metadata["path"] for m in await injected(rt, other) if m.metadata] == [
            str(project / "sub" / "AGENTS.md")
        ]

    # Durable: a restarted runtime does not inject the same file again.
    async with Runtime(config(tmp_path, project)) as rt:
        await turn(rt, sid, '#tool read {"path": "sub/deeper/code.py"}')
        assert len(await injected(rt, sid)) == 2


async def test_a_failed_read_injects_nothing_and_project_discovery_off_injects_nothing(
    tmp_path: Path, project: Path
) -> None:
    async with Runtime(config(tmp_path, project)) as rt:
        sid = (await rt.sessions.create()).id
        await turn(rt, sid, '#tool read {"path": "sub/deeper/missing.py"}')
        assert await injected(rt, sid) == []
    async with Runtime(config(tmp_path, project, project_instructions=False)) as rt:
        await turn(rt, sid, '#tool read {"path": "sub/deeper/code.py"}')
        assert await injected(rt, sid) == []


def test_the_walk_stays_inside_the_location_and_skips_the_file_read(project: Path) -> None:
    cache = FileCache()
    location = str(project)
    assert nearby_files(location, "read", "../outside.txt", cache) == []
    assert nearby_files(location, "read", "notes.txt", cache) == []
    assert nearby_files(location, "grep", "sub/notes.txt", cache) == []
    direct = nearby_files(location, "read", "sub/deeper/AGENTS.md", cache)
    assert [f.shown for f in direct] == ["sub/AGENTS.md"]
    listed = nearby_files(location, "list", "sub/deeper", cache)
    assert [f.shown for f in listed] == ["sub/AGENTS.md", "sub/deeper/AGENTS.md"]
    (project / "sub" / "deeper" / "AGENTS.md").write_text("   \n")
    assert [f.shown for f in nearby_files(location, "list", "sub/deeper", cache)] == [
        "sub/AGENTS.md"
    ]
