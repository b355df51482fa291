"""The run renderer in-process: text, tools, the spinner, duplicates from two sources."""

from __future__ import annotations

import io

import pytest

from server._cli_render import IDLE_S, Renderer, short


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def renderer(
    *, tty_out: bool = False, spinner: bool = False
) -> tuple[Renderer, io.StringIO, io.StringIO, Clock]:
    out: io.StringIO = Terminal() if tty_out else io.StringIO()
    err = Terminal()
    clock = Clock()
    return Renderer(out, err, spinner=spinner, clock=clock), out, err, clock


def test_deltas_stream_and_the_ended_text_completes_a_block() -> None:
    r, out, _, _ = renderer()
    r.text_delta("m1", 0, "Hel")
    r.text_delta("m1", 0, "lo")
    assert out.getvalue() == "Hello"
    r.text_ended("m1", 0, "Hello world")  # the rest of the deltas were lost
    r.text_ended("m1", 0, "Hello world")  # the same fact from the other source
    r.text_delta("m1", 0, " late")  # a delta after the end is ignored
    assert out.getvalue() == "Hello world\n"


def test_a_block_known_only_from_the_log_prints_whole() -> None:
    r, out, _, _ = renderer()
    r.text_ended("m1", 0, "first")
    r.text_ended("m1", 1, "")
    r.text_ended("m2", 0, "second")
    r.close()
    assert out.getvalue() == "first\nsecond\n"


def test_tool_lines_print_once_and_end_pending_text() -> None:
    r, out, err, _ = renderer()
    r.text_delta("m1", 0, "Let me look")
    r.tool_called("c1", "bash", {"command": "ls"})
    r.tool_called("c1", "bash", {"command": "ls"})
    r.tool_succeeded("c1", {"exitCode": 2})
    r.tool_succeeded("c1", {"exitCode": 2})
    r.tool_called("c2", "read", {"path": "x" * 400})
    r.tool_failed("c2", {"type": "tool.error", "message": "no such\nfile"})
    assert out.getvalue() == "Let me look\n"
    lines = err.getvalue().splitlines()
    assert lines[0] == '⚙ bash {"command": "ls"}'
    assert lines[1] == "✓ bash (exit 2)"
    assert lines[2].startswith('⚙ read {"path": "xxx')
    assert lines[2].endswith("…")
    assert lines[3] == "✗ read: no such file"
    assert len(lines) == 4


def test_the_spinner_shows_when_quiet_and_is_erased_before_output() -> None:
    r, out, err, clock = renderer(spinner=True)
    r.tick()
    assert err.getvalue() == ""  # not quiet long enough
    clock.now += IDLE_S
    r.tick()
    assert err.getvalue() == "\r\x1b[K⠋ working 0.2s"
    r.tool_called("c1", "bash", {})
    assert err.getvalue().endswith("\r\x1b[K⚙ bash {}\n")
    clock.now += 1
    r.tick()
    assert err.getvalue().endswith("⠙ running bash 1.2s")
    r.close()
    assert err.getvalue().endswith("\r\x1b[K")
    assert out.getvalue() == ""


def test_the_spinner_never_draws_over_half_a_line_of_text_on_a_shared_terminal() -> None:
    r, _, err, clock = renderer(tty_out=True, spinner=True)
    r.text_delta("m1", 0, "thinking")
    clock.now += 5
    r.tick()
    assert err.getvalue() == ""
    r.text_ended("m1", 0, "thinking")
    clock.now += 5
    r.tick()
    assert "working" in err.getvalue()


def test_no_spinner_when_it_is_off() -> None:
    r, _, err, clock = renderer(spinner=False)
    clock.now += 10
    r.tick()
    assert err.getvalue() == ""


@pytest.mark.parametrize(
    ("text", "expected"),
    [("a  b\nc", "a b c"), ("x" * 10, "x" * 10), ("x" * 11, "x" * 9 + "…")],
)
def test_short(text: str, expected: str) -> None:
    assert short(text, 10) == expected


def test_reasoning_streams_dimmed_on_stderr_and_completes_once() -> None:
    r, out, err, _ = renderer()
    r.reasoning_delta("m1", 0, "think")
    r.reasoning_delta("m1", 0, "ing")
    assert err.getvalue() == "\x1b[2mthink\x1b[0m\x1b[2ming\x1b[0m"
    r.reasoning_ended("m1", 0, "thinking hard")  # deltas lost: the log completes it
    r.reasoning_ended("m1", 0, "thinking hard")  # the other source: nothing again
    r.text_delta("m1", 1, "answer")
    r.close()
    assert err.getvalue() == "\x1b[2mthink\x1b[0m\x1b[2ming\x1b[0m\x1b[2m hard\x1b[0m\n"
    assert out.getvalue() == "answer\n"


def test_reasoning_is_plain_when_stderr_is_no_terminal() -> None:
    out, err = io.StringIO(), io.StringIO()
    r = Renderer(out, err, spinner=False)
    r.text_delta("m1", 0, "half")
    r.reasoning_ended("m1", 1, "a thought")
    r.tool_called("c1", "bash", {"command": "ls"})
    assert out.getvalue() == "half\n"
    assert err.getvalue() == 'a thought\n⚙ bash {"command": "ls"}\n'
