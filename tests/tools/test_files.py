"""The file tools (read, write, edit, list) and Location confinement, on real files."""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path

import pytest

from actors.tools import OutputBounding, ToolContext, ToolError, ToolExecutor, ToolResult
from actors.tools.builtin import EditTool, GrepTool, ListTool, ReadTool, WriteTool

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


def only_text(result: ToolResult) -> str:
    assert len(result.content) == 1
    assert result.content[0]["type"] == "text"
    text: str = result.content[0]["text"]
    return text


def error_of(call: Callable[[], object]) -> ToolError:
    with pytest.raises(ToolError) as raised:
        call()
    return raised.value


# -- read ------------------------------------------------------------------------------------


def test_read_returns_numbered_lines(location: Path, ctx: ToolContext) -> None:
    (location / "a.txt").write_text("alpha\nbeta\n")
    result = ReadTool().run({"path": "a.txt"}, ctx)
    assert only_text(result) == "     1\talpha\n     2\tbeta"
    assert result.metadata == {"path": "a.txt", "lines": 2}


def test_read_pages_with_offset_and_limit(location: Path, ctx: ToolContext) -> None:
    (location / "n.txt").write_text("".join(f"line {n}\n" for n in range(1, 11)))
    text = only_text(ReadTool().run({"path": "n.txt", "offset": 4, "limit": 2}, ctx))
    assert text == "     4\tline 4\n     5\tline 5\n\n(more lines follow; continue with offset=6)"
    past = only_text(ReadTool().run({"path": "n.txt", "offset": 50}, ctx))
    assert past == "(no lines at offset 50; n.txt has 10 lines)"


def test_read_reports_empty_missing_directory_and_binary(location: Path, ctx: ToolContext) -> None:
    (location / "empty").write_text("")
    (location / "sub").mkdir()
    (location / "blob.bin").write_bytes(b"\x7fELF\x00\x01")
    assert only_text(ReadTool().run({"path": "empty"}, ctx)) == "(empty file)"
    assert "File not found" in error_of(lambda: ReadTool().run({"path": "nope"}, ctx)).message
    assert "directory" in error_of(lambda: ReadTool().run({"path": "sub"}, ctx)).message
    assert "binary" in error_of(lambda: ReadTool().run({"path": "blob.bin"}, ctx)).message


def test_read_returns_an_image_as_a_file_item(location: Path, ctx: ToolContext) -> None:
    (location / "dot.png").write_bytes(PNG)
    result = ReadTool().run({"path": "dot.png"}, ctx)
    assert result.content[1] == {
        "type": "file",
        "mime": "image/png",
        "data": base64.b64encode(PNG).decode(),
        "filename": "dot.png",
    }


# -- write / edit --------------------------------------------------------------------------------


def test_write_creates_parent_directories(location: Path, ctx: ToolContext) -> None:
    result = WriteTool().run({"path": "deep/er/new.txt", "content": "héllo"}, ctx)
    assert (location / "deep/er/new.txt").read_text() == "héllo"
    assert result.metadata == {"path": "deep/er/new.txt", "bytes": 6, "created": True}
    again = WriteTool().run({"path": "deep/er/new.txt", "content": "x"}, ctx)
    assert again.metadata["created"] is False
    assert (location / "deep/er/new.txt").read_text() == "x"


def test_edit_replaces_a_unique_string(location: Path, ctx: ToolContext) -> None:
    (location / "f.py").write_text("a = 1\nb = 2\n")
    result = EditTool().run({"path": "f.py", "old_string": "b = 2", "new_string": "b = 3"}, ctx)
    assert (location / "f.py").read_text() == "a = 1\nb = 3\n"
    assert result.metadata == {"path": "f.py", "replacements": 1}


def test_edit_refuses_ambiguous_missing_and_identical_strings(
    location: Path, ctx: ToolContext
) -> None:
    (location / "f.txt").write_text("x x x")
    tool = EditTool()
    twice = error_of(lambda: tool.run({"path": "f.txt", "old_string": "x", "new_string": "y"}, ctx))
    assert "3 times" in twice.message
    missing = error_of(
        lambda: tool.run({"path": "f.txt", "old_string": "z", "new_string": "y"}, ctx)
    )
    assert "not found" in missing.message
    same = error_of(lambda: tool.run({"path": "f.txt", "old_string": "x", "new_string": "x"}, ctx))
    assert same.type == "invalid-input"
    assert (location / "f.txt").read_text() == "x x x"


def test_edit_replace_all_keeps_line_endings(location: Path, ctx: ToolContext) -> None:
    (location / "crlf.txt").write_bytes(b"x = 1\r\nx = 2\r\n")
    result = EditTool().run(
        {"path": "crlf.txt", "old_string": "x", "new_string": "y", "replace_all": True}, ctx
    )
    assert (location / "crlf.txt").read_bytes() == b"y = 1\r\ny = 2\r\n"
    assert result.metadata["replacements"] == 2


# -- list ------------------------------------------------------------------------------------


def test_list_sorts_and_marks_directories(location: Path, ctx: ToolContext) -> None:
    (location / "b.txt").write_text("")
    (location / "a").mkdir()
    (location / "C.md").write_text("")
    assert only_text(ListTool().run({}, ctx)) == "C.md\na/\nb.txt"
    (location / "a" / "inner").write_text("")
    assert only_text(ListTool().run({"path": "a"}, ctx)) == "inner"
    assert only_text(ListTool().run({"path": "a/inner/.."}, ctx)) == "inner"


# -- confinement -----------------------------------------------------------------------------


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "outside"
    path.mkdir()
    (path / "secret.txt").write_text("top secret\n")
    return path


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlinked dir", "symlinked file"])
def test_paths_outside_the_location_are_denied(
    location: Path, outside: Path, ctx: ToolContext, how: str
) -> None:
    (location / "linkdir").symlink_to(outside, target_is_directory=True)
    (location / "linkfile").symlink_to(outside / "secret.txt")
    path = {
        "dotdot": "../outside/secret.txt",
        "absolute": str(outside / "secret.txt"),
        "symlinked dir": "linkdir/secret.txt",
        "symlinked file": "linkfile",
    }[how]
    calls: list[Callable[[], object]] = [
        lambda: ReadTool().run({"path": path}, ctx),
        lambda: WriteTool().run({"path": path, "content": "pwned"}, ctx),
        lambda: EditTool().run({"path": path, "old_string": "top", "new_string": "no"}, ctx),
        lambda: GrepTool().run({"pattern": "secret", "path": path}, ctx),
    ]
    for call in calls:
        error = error_of(call)
        assert error.type == "denied"
        assert "outside the session's location" in error.message
    assert (outside / "secret.txt").read_text() == "top secret\n"


def test_listing_outside_the_location_is_denied(ctx: ToolContext) -> None:
    assert error_of(lambda: ListTool().run({"path": ".."}, ctx)).type == "denied"


def test_a_write_through_a_dangling_symlink_to_outside_is_denied(
    location: Path, outside: Path, ctx: ToolContext
) -> None:
    (location / "dangling").symlink_to(outside / "new.txt")
    error = error_of(lambda: WriteTool().run({"path": "dangling", "content": "x"}, ctx))
    assert error.type == "denied"
    assert not (outside / "new.txt").exists()


def test_a_symlink_that_stays_inside_is_fine(location: Path, ctx: ToolContext) -> None:
    (location / "real.txt").write_text("inside\n")
    (location / "alias").symlink_to(location / "real.txt")
    assert only_text(ReadTool().run({"path": "alias"}, ctx)) == "     1\tinside"


# -- managed output files ------------------------------------------------------------------------


def test_managed_output_files_are_readable_and_searchable(
    output_dir: Path, ctx: ToolContext
) -> None:
    result = OutputBounding(output_dir=output_dir, max_lines=1).bound(
        ToolResult.text("first\nsecond needle\nthird")
    )
    path = result.metadata["outputPath"]
    read = only_text(ReadTool().run({"path": path, "offset": 2}, ctx))
    assert read == "     2\tsecond needle\n     3\tthird"
    grep = only_text(GrepTool().run({"pattern": "needle", "path": path}, ctx))
    assert grep == f"{path}:2:second needle"


def test_other_files_in_the_output_dir_are_not_readable(output_dir: Path, ctx: ToolContext) -> None:
    output_dir.mkdir()
    (output_dir / "notes.txt").write_text("private\n")
    error = error_of(lambda: ReadTool().run({"path": str(output_dir / "notes.txt")}, ctx))
    assert error.type == "denied"
    error = error_of(lambda: ListTool().run({"path": str(output_dir)}, ctx))
    assert error.type == "denied"


def test_write_and_edit_never_touch_the_output_dir(
    location: Path, make_ctx: Callable[..., ToolContext]
) -> None:
    # Even when the output dir lies inside the Location.
    inner = location / "tool-output"
    inner.mkdir()
    (inner / "tool_000000000000x").write_text("saved\n")
    ctx = make_ctx(output_dir=inner)
    for call in [
        lambda: WriteTool().run({"path": "tool-output/tool_000000000000x", "content": ""}, ctx),
        lambda: WriteTool().run({"path": "tool-output/new", "content": ""}, ctx),
        lambda: EditTool().run(
            {"path": "tool-output/tool_000000000000x", "old_string": "saved", "new_string": "x"},
            ctx,
        ),
    ]:
        assert error_of(call).type == "denied"
    assert (inner / "tool_000000000000x").read_text() == "saved\n"


@pytest.fixture
def big_file(location: Path) -> Path:
    path = location / "big.txt"
    path.write_text("".join(f"row {n}\n" for n in range(3_000)))
    return path


async def test_a_truncated_result_can_be_read_back_through_the_executor(
    executor: ToolExecutor, bounding: OutputBounding, big_file: Path, ctx: ToolContext
) -> None:
    first = await executor.execute("read", {"path": "big.txt", "limit": 3_000}, ctx)
    assert first.status == "success"
    assert first.metadata["truncated"] is True
    path = first.metadata["outputPath"]
    assert Path(path).parent == bounding.output_dir
    again = await executor.execute("grep", {"pattern": "^ +2999\t", "path": path}, ctx)
    assert again.content[0]["text"] == f"{path}:2999:  2999\trow 2998"
