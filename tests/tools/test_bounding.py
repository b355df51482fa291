"""Output bounding: the cases of OpenCode's tool-output.test.ts, plus lossy saving and retention.

Unlike the OpenCode version read (head only), the preview keeps the beginning
*and* the end of the output (the glossary's "Generic truncation preserves the
beginning and end of textual output"), with the marker where text was left out.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest
from manual_clock import ManualClock

from actors import BlockingExecutor
from actors.tools import OutputBounding, ToolResult, run_sweeper, text_item
from protocol import ids

DAY = 86_400.0
NOW = 2_000_000_000.0  # an injected "now", far from the real clock on purpose
NOW_MS = int(NOW * 1000)


def text(value: str) -> ToolResult:
    return ToolResult(content=[text_item(value)])


def marker_path(item: object) -> str:
    assert isinstance(item, dict)
    body: str = item["text"]
    assert body.startswith("... ")
    assert body.endswith(" ...")
    return body.split("full content saved to ", 1)[1][: -len(" ...")]


def test_writes_oversized_text_and_returns_a_bounded_preview(output_dir: Path) -> None:
    bounding = OutputBounding(output_dir=output_dir, max_lines=2, max_bytes=1_000)
    result = bounding.bound(
        ToolResult(content=[text_item("one\ntwo\nthree")], metadata={"source": "tool"})
    )
    path = result.metadata["outputPath"]
    assert result.metadata == {"source": "tool", "truncated": True, "outputPath": path}
    assert Path(path).is_absolute()
    assert Path(path).parent == output_dir
    assert ids.is_valid("tool", Path(path).name)
    # The whole text was saved before the preview came back.
    assert Path(path).read_text() == "one\ntwo\nthree"
    assert result.content == (
        text_item("one"),
        text_item(f"... 1 line truncated; full content saved to {path} ..."),
        text_item("three"),
    )


def test_keeps_the_beginning_and_the_end_of_a_long_output(output_dir: Path) -> None:
    bounding = OutputBounding(output_dir=output_dir, max_lines=4, max_bytes=1_000)
    lines = [f"line {n}" for n in range(1, 11)]
    result = bounding.bound(text("\n".join(lines) + "\n"))
    path = result.metadata["outputPath"]
    assert result.content == (
        text_item("line 1\nline 2"),
        text_item(f"... 6 lines truncated; full content saved to {path} ..."),
        text_item("line 9\nline 10\n"),
    )
    assert Path(path).read_text() == "\n".join(lines) + "\n"


def test_the_end_gets_what_the_beginning_left_of_the_byte_budget(output_dir: Path) -> None:
    # 40 bytes: the beginning takes what fits in 20, the end the remaining 20 or so.
    bounding = OutputBounding(output_dir=output_dir, max_lines=100, max_bytes=40)
    body = "\n".join(f"{n:04d}" for n in range(100))  # 5 bytes a line with its newline
    result = bounding.bound(text(body))
    head, marker, tail = (item["text"] for item in result.content)
    assert head == "0000\n0001\n0002\n0003"
    assert tail == "0096\n0097\n0098\n0099"
    assert len(head.encode()) + len(tail.encode()) <= 40
    assert marker.startswith(f"... {len(body) - len(head) - len(tail)} bytes truncated; ")


def test_reports_bytes_omitted_by_the_byte_limit(output_dir: Path) -> None:
    bounding = OutputBounding(output_dir=output_dir, max_lines=100, max_bytes=5)
    result = bounding.bound(text("one\ntwo"))
    path = result.metadata["outputPath"]
    # Neither half fits beside the other: the end is kept, being the most recent.
    assert result.content == (
        text_item(f"... 4 bytes truncated; full content saved to {path} ..."),
        text_item("two"),
    )


def test_preserves_mixed_content_ordering(output_dir: Path) -> None:
    bounding = OutputBounding(output_dir=output_dir, max_lines=2, max_bytes=1_000)
    file = {"type": "file", "mime": "image/png", "data": "iVBORw0KGgo="}
    result = bounding.bound(
        ToolResult(content=[text_item("before"), file, text_item("after\nomitted")])
    )
    path = result.metadata["outputPath"]
    assert result.content == (
        text_item("before"),
        file,
        text_item(f"... 1 line truncated; full content saved to {path} ..."),
        text_item("omitted"),
    )
    assert Path(path).read_text() == "before\nafter\nomitted"


@pytest.mark.parametrize("state", [True, False])
def test_skips_results_that_report_a_truncation_state(output_dir: Path, state: bool) -> None:
    bounding = OutputBounding(output_dir=output_dir, max_lines=1, max_bytes=1)
    result = ToolResult(content=[text_item("one\ntwo")], metadata={"truncated": state, "x": 1})
    assert bounding.bound(result) is result
    assert not output_dir.exists()


def test_marks_results_that_fit_without_changing_their_content(output_dir: Path) -> None:
    bounding = OutputBounding(output_dir=output_dir)
    result = bounding.bound(text("small"))
    assert result == ToolResult(content=[text_item("small")], metadata={"truncated": False})
    assert not output_dir.exists()


def test_does_not_count_a_trailing_newline_as_another_line(output_dir: Path) -> None:
    bounding = OutputBounding(output_dir=output_dir, max_lines=2, max_bytes=1_000)
    result = bounding.bound(text("one\ntwo\n"))
    assert result == ToolResult(content=[text_item("one\ntwo\n")], metadata={"truncated": False})


def test_reports_a_trailing_newline_omitted_by_the_byte_limit(output_dir: Path) -> None:
    bounding = OutputBounding(output_dir=output_dir, max_lines=2, max_bytes=3)
    result = bounding.bound(text("one\n"))
    path = result.metadata["outputPath"]
    assert result.content == (
        text_item("one"),
        text_item(f"... 1 byte truncated; full content saved to {path} ..."),
    )
    assert Path(path).read_text() == "one\n"


def test_plural_lines_and_the_default_limits(output_dir: Path) -> None:
    bounding = OutputBounding(output_dir=output_dir)
    assert (bounding.max_lines, bounding.max_bytes) == (2_000, 51_200)
    lines = "\n".join(str(n) for n in range(2_005))
    result = bounding.bound(text(lines))
    assert result.content[0] == text_item("\n".join(str(n) for n in range(1_000)))
    assert result.content[1]["text"].startswith("... 5 lines truncated; full content saved to ")
    assert result.content[2] == text_item("\n".join(str(n) for n in range(1_005, 2_005)))


def test_the_byte_budget_counts_utf8_bytes_and_newlines(output_dir: Path) -> None:
    # "ééé" is 6 bytes and "x" 1: both fit in 7, the newline between them does not.
    bounding = OutputBounding(output_dir=output_dir, max_lines=10, max_bytes=7)
    result = bounding.bound(text("ééé\nx"))
    assert result.content[0] == text_item("ééé")
    assert result.content[1]["text"].startswith("... 1 byte truncated; ")
    assert result.content[2] == text_item("x")


def test_a_single_oversized_line_leaves_only_the_marker(output_dir: Path) -> None:
    bounding = OutputBounding(output_dir=output_dir, max_bytes=10)
    result = bounding.bound(text("x" * 25))
    assert len(result.content) == 1
    assert result.content[0]["text"].startswith("... 25 bytes truncated; ")


def test_text_items_are_cut_in_order_and_non_text_items_keep_their_place(
    output_dir: Path,
) -> None:
    bounding = OutputBounding(output_dir=output_dir, max_lines=3, max_bytes=1_000)
    image = {"type": "file", "mime": "image/gif", "data": "R0lGODlh"}
    result = bounding.bound(
        ToolResult(content=[text_item("a\nb"), text_item("c\nd"), image, text_item("e")])
    )
    path = result.metadata["outputPath"]
    assert result.content == (
        text_item("a\nb"),
        text_item(f"... 2 lines truncated; full content saved to {path} ..."),
        image,
        text_item("e"),
    )
    assert Path(path).read_text() == "a\nb\nc\nd\ne"


def test_a_result_without_text_is_left_alone(output_dir: Path) -> None:
    image = {"type": "file", "mime": "image/png", "data": "AAAA"}
    result = OutputBounding(output_dir=output_dir).bound(ToolResult(content=[image]))
    assert result.content == (image,)
    assert result.metadata == {"truncated": False}


def test_an_unwritable_output_dir_gives_an_explicitly_lossy_preview(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the output directory should be")
    bounding = OutputBounding(output_dir=blocker, max_lines=2, max_bytes=1_000)
    with caplog.at_level(logging.WARNING, logger="actors.tools._bounding"):
        result = bounding.bound(text("one\ntwo\nthree"))
    assert result.content == (
        text_item("one"),
        text_item("... 1 line truncated; full content could not be saved ..."),
        text_item("three"),
    )
    assert result.metadata["truncated"] is True
    assert "outputPath" not in result.metadata
    assert result.metadata["outputError"]
    assert "could not save full tool output" in caplog.text


def test_every_truncation_gets_its_own_file(output_dir: Path) -> None:
    bounding = OutputBounding(output_dir=output_dir, max_lines=1)
    first = bounding.bound(text("a\nb")).metadata["outputPath"]
    second = bounding.bound(text("c\nd")).metadata["outputPath"]
    assert first != second
    assert sorted(p.name for p in output_dir.iterdir()) == sorted(
        [Path(first).name, Path(second).name]
    )


def _aged(path: Path, content: str, age_s: float) -> Path:
    path.write_text(content)
    os.utime(path, (NOW - age_s, NOW - age_s))
    return path


def test_cleanup_uses_file_modification_time_when_ids_wrap(output_dir: Path) -> None:
    output_dir.mkdir()
    # The old file's id sorts *after* the recent one's: only mtime may decide.
    old = _aged(output_dir / ("tool_ffffffffffff" + "Z" * 14), "old", 8 * DAY)
    recent = _aged(output_dir / ("tool_000000000000" + "A" * 14), "recent", 6 * DAY)
    bounding = OutputBounding(output_dir=output_dir, clock=ManualClock(NOW_MS))
    assert bounding.sweep() == 1
    assert not old.exists()
    assert recent.exists()


def test_cleanup_only_deletes_managed_files(output_dir: Path) -> None:
    output_dir.mkdir()
    stray = _aged(output_dir / "notes.txt", "keep", 30 * DAY)
    short = _aged(output_dir / "tool_abc", "keep: not one of our ids", 30 * DAY)
    subdir = output_dir / ("tool_" + "0" * 12 + "dir")
    subdir.mkdir()
    os.utime(subdir, (NOW - 30 * DAY, NOW - 30 * DAY))
    managed = _aged(output_dir / ids.tool_output_id(), "gone", 7 * DAY + 1)
    bounding = OutputBounding(output_dir=output_dir)
    assert bounding.sweep(now=NOW) == 1
    assert not managed.exists()
    assert stray.exists()
    assert short.exists()
    assert subdir.is_dir()


def test_cleanup_keeps_a_file_exactly_at_the_retention_age(output_dir: Path) -> None:
    output_dir.mkdir()
    edge = _aged(output_dir / ids.tool_output_id(), "edge", 7 * DAY)
    assert OutputBounding(output_dir=output_dir).sweep(now=NOW) == 0
    assert edge.exists()


def test_cleanup_of_a_missing_directory_removes_nothing(output_dir: Path) -> None:
    assert OutputBounding(output_dir=output_dir).sweep(now=NOW) == 0


def test_limits_must_be_positive(output_dir: Path) -> None:
    with pytest.raises(ValueError, match="positive"):
        OutputBounding(output_dir=output_dir, max_lines=0)
    with pytest.raises(ValueError, match="positive"):
        OutputBounding(output_dir=output_dir, retention_days=0)


async def test_the_sweeper_runs_at_start_and_after_each_interval_of_its_clock(
    blocking: BlockingExecutor, output_dir: Path
) -> None:
    """A file that is not old enough at the start sweep is gone at the next one, an
    hour later on the sweeper's clock; not a millisecond earlier."""
    runner = blocking

    def age_one(content: str, age_s: float) -> Path:
        output_dir.mkdir(exist_ok=True)
        return _aged(output_dir / ids.tool_output_id(), content, age_s)

    await runner.run(age_one, "old", 8 * DAY)
    young = await runner.run(age_one, "old within the hour", 7 * DAY - 1800)
    clock = ManualClock(NOW_MS)
    bounding = OutputBounding(output_dir=output_dir, clock=clock)
    counts: asyncio.Queue[int] = asyncio.Queue()
    sweeper = asyncio.create_task(
        run_sweeper(bounding, runner, clock, interval_s=3600.0, on_sweep=counts.put_nowait)
    )
    try:
        async with asyncio.timeout(10):
            assert await counts.get() == 1  # at start, before any interval
            await clock.until_sleeping()  # the sweeper waits on its clock now
            assert clock.next_due_ms == 3_600_000
            assert clock.advance(3_599_999) == 0  # not yet: nothing woke, nothing swept
            assert counts.empty()
            assert await runner.run(young.exists)
            assert clock.advance(1) == 1
            assert await counts.get() == 1
            assert not await runner.run(young.exists)
            await clock.until_sleeping()
            assert clock.next_due_ms == 3_600_000
    finally:
        sweeper.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sweeper


async def test_the_sweeper_ends_when_the_runner_closes(output_dir: Path) -> None:
    runner = BlockingExecutor(limit=1)
    async with runner:
        pass
    await run_sweeper(OutputBounding(output_dir=output_dir), runner)
