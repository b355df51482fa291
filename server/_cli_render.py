"""How ``sessionrt run`` shows a run in a terminal: text on stdout, the rest on stderr.

The assistant's text goes to stdout as its deltas arrive; each text block
ends with a newline when it ends. Reasoning goes to stderr the same way,
as it streams, dimmed when stderr is a terminal. Tool activity goes to stderr as one line
per call (``⚙ bash {"command": "ls"}``) and one per outcome (``✓ bash`` or
``✗ bash: <error>``). While nothing is printed for a moment and stderr is a
terminal, a spinner line on stderr shows that the run is alive; it is erased
before anything else is written, and never drawn over a half-written line
of text when stdout is the same terminal.

Every method is idempotent per block or call: the same fact may arrive twice
(from the instance feed and from the session log) and prints once. A text
block the feed streamed only in part is completed from the durable
``session.text.ended``, so the output is whole even when deltas were lost.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from typing import Any, Final, TextIO

import attrs

__all__ = ["Renderer", "short"]

SPINNER_FRAMES: Final = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
#: Quiet time before the spinner shows, seconds.
IDLE_S: Final = 0.25
_CLEAR: Final = "\r\x1b[K"
_DIM: Final = "\x1b[2m"
_RESET: Final = "\x1b[0m"
_SHORT: Final = 160


def short(text: str, limit: int = _SHORT) -> str:
    """One line of at most ``limit`` characters."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


@attrs.define
class _Block:
    printed: str = ""
    closed: bool = False


@attrs.define
class _Call:
    name: str
    announced: bool = False
    done: bool = False


class Renderer:
    """Writes one run's output; ``spinner`` only makes sense when ``err`` is a terminal."""

    def __init__(
        self,
        out: TextIO,
        err: TextIO,
        *,
        spinner: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._out = out
        self._err = err
        self._spinner = spinner
        self._out_tty = _isatty(out)
        self._clock = clock
        self._started = clock()
        self._last_output = self._started
        self._blocks: dict[tuple[str, int], _Block] = {}
        self._thoughts: dict[tuple[str, int], _Block] = {}
        self._err_tty = _isatty(err)
        self._err_mid_line = False
        self._calls: dict[str, _Call] = {}
        self._mid_line = False
        self._spinning = False
        self._frame = 0

    # -- text -------------------------------------------------------------------------------

    def text_delta(self, message_id: str, ordinal: int, delta: str) -> None:
        block = self._blocks.setdefault((message_id, ordinal), _Block())
        if block.closed or not delta:
            return
        self._end_thought()
        block.printed += delta
        self._write_out(delta)

    def text_ended(self, message_id: str, ordinal: int, text: str) -> None:
        block = self._blocks.setdefault((message_id, ordinal), _Block())
        if block.closed:
            return
        block.closed = True
        self._end_thought()
        if text.startswith(block.printed):
            self._write_out(text[len(block.printed) :])
        self.end_line()

    def _end_thought(self) -> None:
        if self._err_mid_line:
            self._err_mid_line = False
            self._write_err("\n")

    def end_line(self) -> None:
        """End a half-written line of text or reasoning (a block that ended, a run that stopped)."""
        if self._mid_line:
            self._write_out("\n")
        if self._err_mid_line:
            self._err_mid_line = False
            self._write_err("\n")

    # -- reasoning --------------------------------------------------------------------------

    def reasoning_delta(self, message_id: str, ordinal: int, delta: str) -> None:
        block = self._thoughts.setdefault((message_id, ordinal), _Block())
        if block.closed or not delta:
            return
        if not block.printed and self._mid_line:
            self._write_out("\n")
        block.printed += delta
        self._write_thought(delta)

    def reasoning_ended(self, message_id: str, ordinal: int, text: str) -> None:
        block = self._thoughts.setdefault((message_id, ordinal), _Block())
        if block.closed:
            return
        block.closed = True
        if text.startswith(block.printed):
            if not block.printed and self._mid_line:
                self._write_out("\n")
            self._write_thought(text[len(block.printed) :])
        self.end_line()

    def _write_thought(self, text: str) -> None:
        if not text:
            return
        shown = f"{_DIM}{text}{_RESET}" if self._err_tty else text
        self._write_err(shown)
        self._err_mid_line = not text.endswith("\n")

    # -- tools ------------------------------------------------------------------------------

    def tool_called(self, call_id: str, name: str, input: Mapping[str, Any]) -> None:
        call = self._calls.setdefault(call_id, _Call(name=name))
        if call.announced:
            return
        call.announced = True
        self.end_line()
        self._write_err(f"⚙ {name} {short(json.dumps(input, ensure_ascii=False))}\n")

    def tool_succeeded(self, call_id: str, metadata: Mapping[str, Any] | None) -> None:
        call = self._finish_call(call_id)
        if call is None:
            return
        exit_code = (metadata or {}).get("exitCode")
        suffix = f" (exit {exit_code})" if isinstance(exit_code, int) and exit_code else ""
        self._write_err(f"✓ {call.name}{suffix}\n")

    def tool_failed(self, call_id: str, error: Mapping[str, Any]) -> None:
        call = self._finish_call(call_id)
        if call is None:
            return
        message = short(str(error.get("message", "")), 120)
        self._write_err(f"✗ {call.name}: {message}\n")

    def _finish_call(self, call_id: str) -> _Call | None:
        call = self._calls.setdefault(call_id, _Call(name="tool"))
        if call.done:
            return None
        call.done = True
        self.end_line()
        return call

    # -- notes and the spinner --------------------------------------------------------------

    def note(self, line: str) -> None:
        """A line for the user on stderr, after any half-written text."""
        self.end_line()
        self._write_err(line + "\n")

    def close(self) -> None:
        """The run is over: erase the spinner and end the text's last line."""
        self._erase()
        self.end_line()

    def tick(self) -> None:
        """Draw the next spinner frame if the run has been quiet for a moment."""
        now = self._clock()
        if not self._spinner or now - self._last_output < IDLE_S:
            return
        if (self._mid_line and self._out_tty) or self._err_mid_line:
            return  # the spinner would overwrite the text on the shared terminal line
        running = [c.name for c in self._calls.values() if c.announced and not c.done]
        doing = f"running {running[-1]}" if running else "working"
        frame = SPINNER_FRAMES[self._frame % len(SPINNER_FRAMES)]
        self._frame += 1
        self._err.write(f"{_CLEAR}{frame} {doing} {now - self._started:.1f}s")
        self._err.flush()
        self._spinning = True

    async def spin(self, interval: float = 0.1) -> None:
        """Tick until cancelled (a no-op loop when the spinner is off)."""
        if not self._spinner:
            return
        while True:
            await asyncio.sleep(interval)
            self.tick()

    # -- writing ----------------------------------------------------------------------------

    def _erase(self) -> None:
        if self._spinning:
            self._spinning = False
            self._err.write(_CLEAR)
            self._err.flush()

    def _write_out(self, text: str) -> None:
        if not text:
            return
        self._erase()
        self._out.write(text)
        self._out.flush()
        self._mid_line = not text.endswith("\n")
        self._last_output = self._clock()

    def _write_err(self, text: str) -> None:
        self._erase()
        self._err.write(text)
        self._err.flush()
        self._last_output = self._clock()


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
