"""glob and grep: matching rules, confinement of the walk, caps."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from actors.tools import ToolContext, ToolError, ToolResult
from actors.tools.builtin import GlobTool, GrepTool
from actors.tools.builtin._search import MAX_GLOB_MATCHES, MAX_GREP_MATCHES


def lines(result: ToolResult) -> list[str]:
    assert len(result.content) == 1
    text: str = result.content[0]["text"]
    return text.split("\n")


@pytest.fixture
def tree(location: Path, tmp_path: Path) -> Path:
    files = {
        "main.py": "import os\nprint('hello')\n",
        "README.md": "hello readme\n",
        "pkg/mod.py": "def hello():\n    return 1\n",
        "pkg/sub/deep.py": "HELLO = 'deep'\n",
        "pkg/data.json": '{"hello": true}\n',
        ".git/config": "hello from git\n",
    }
    for name, content in files.items():
        path = location / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    (location / "image.bin").write_bytes(b"hello\x00binary")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "leak.py").write_text("hello leak\n")
    (location / "linked").symlink_to(elsewhere, target_is_directory=True)
    (location / "leak_link.py").symlink_to(elsewhere / "leak.py")
    return location


# -- glob --------------------------------------------------------------------------------------


def test_a_pattern_without_double_star_stays_at_its_depth(tree: Path, ctx: ToolContext) -> None:
    assert lines(GlobTool().run({"pattern": "*.py"}, ctx)) == ["main.py"]
    assert lines(GlobTool().run({"pattern": "pkg/*.py"}, ctx)) == ["pkg/mod.py"]


def test_double_star_spans_directories_sorted(tree: Path, ctx: ToolContext) -> None:
    result = GlobTool().run({"pattern": "**/*.py"}, ctx)
    assert lines(result) == ["main.py", "pkg/mod.py", "pkg/sub/deep.py"]
    assert result.metadata == {"count": 3}
    assert lines(GlobTool().run({"pattern": "pkg/**"}, ctx)) == [
        "pkg/data.json",
        "pkg/mod.py",
        "pkg/sub/deep.py",
    ]


def test_glob_skips_git_and_does_not_follow_links_outside(tree: Path, ctx: ToolContext) -> None:
    found = lines(GlobTool().run({"pattern": "**"}, ctx))
    assert not any(name.startswith(".git/") for name in found)
    assert not any("leak" in name for name in found)


@pytest.mark.parametrize("pattern", ["../*", "/etc/*", "pkg/../../*"])
def test_glob_patterns_cannot_leave_the_location(ctx: ToolContext, pattern: str) -> None:
    with pytest.raises(ToolError) as raised:
        GlobTool().run({"pattern": pattern}, ctx)
    assert raised.value.type == "denied"


def test_glob_with_no_match(tree: Path, ctx: ToolContext) -> None:
    assert lines(GlobTool().run({"pattern": "*.rs"}, ctx)) == ["No files found"]


def test_glob_is_capped(location: Path, ctx: ToolContext) -> None:
    for n in range(MAX_GLOB_MATCHES + 5):
        (location / f"f{n:05}.txt").write_text("")
    found = lines(GlobTool().run({"pattern": "*.txt"}, ctx))
    assert len(found) == MAX_GLOB_MATCHES + 1
    assert found[0] == "f00000.txt"
    assert found[-1] == "(… and 5 more files)"


# -- grep --------------------------------------------------------------------------------------


def test_grep_reports_file_line_and_text(tree: Path, ctx: ToolContext) -> None:
    result = GrepTool().run({"pattern": "hello"}, ctx)
    assert lines(result) == [
        "README.md:1:hello readme",
        "main.py:2:print('hello')",
        'pkg/data.json:1:{"hello": true}',
        "pkg/mod.py:1:def hello():",
    ]
    assert result.metadata == {"matches": 4, "capped": False}


def test_grep_with_include_and_path(tree: Path, ctx: ToolContext) -> None:
    assert lines(GrepTool().run({"pattern": "(?i)hello", "include": "*.py"}, ctx)) == [
        "main.py:2:print('hello')",
        "pkg/mod.py:1:def hello():",
        "pkg/sub/deep.py:1:HELLO = 'deep'",
    ]
    assert lines(GrepTool().run({"pattern": "hello", "path": "pkg", "include": "*.json"}, ctx)) == [
        'pkg/data.json:1:{"hello": true}'
    ]
    assert lines(GrepTool().run({"pattern": "return", "path": "pkg/mod.py"}, ctx)) == [
        "pkg/mod.py:2:    return 1"
    ]


def test_grep_rejects_a_bad_regex(ctx: ToolContext) -> None:
    with pytest.raises(ToolError) as raised:
        GrepTool().run({"pattern": "("}, ctx)
    assert raised.value.type == "invalid-input"


def test_grep_with_no_match(tree: Path, ctx: ToolContext) -> None:
    assert lines(GrepTool().run({"pattern": "zebra"}, ctx)) == ["No matches found"]


def test_grep_is_capped(location: Path, ctx: ToolContext) -> None:
    (location / "many.txt").write_text("match\n" * (MAX_GREP_MATCHES + 100))
    found = lines(GrepTool().run({"pattern": "match"}, ctx))
    assert len(found) == MAX_GREP_MATCHES + 1
    assert found[-1] == f"(results capped at {MAX_GREP_MATCHES} matches)"


def test_a_cancelled_walk_is_aborted(tree: Path, make_ctx: Callable[..., ToolContext]) -> None:
    ctx = make_ctx()
    ctx.cancel.set()
    with pytest.raises(ToolError) as raised:
        GrepTool().run({"pattern": "hello"}, ctx)
    assert raised.value.type == "aborted"
