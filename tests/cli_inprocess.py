"""The console script's ``main`` run in this process, as a subprocess of it would run.

Each CLI subprocess paid for a fresh interpreter importing the whole package
(seconds each on a loaded 2-core machine); the CLI's behaviour is ``main``
with its argv, environment, stdout and stderr, so most tests run that here.
``main`` runs its own event loop (``asyncio.run``), so it runs in a thread of
its own while the test's loop waits for it; its output goes to buffers, its
environment and working directory are the ones given for the call, its stdin is
not a terminal. What only a real process has (a signal from outside, a terminal,
the exit status as the shell sees it) keeps one end-to-end subprocess test per
command.

One call at a time per pytest process (xdist workers are processes): stdout,
stderr, stdin, the environment and the working directory are the process's own
while ``main`` runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import attrs

from server import _cli_run, cli

#: What a call may take before the test fails (a subprocess had the same guard).
TIMEOUT = 30

_one_at_a_time = threading.Lock()


@attrs.frozen
class Done:
    code: int | None
    out: str
    err: str

    def lines(self) -> list[dict[str, Any]]:
        import json

        return [json.loads(line) for line in self.out.splitlines()]


@contextlib.contextmanager
def _environment(env: dict[str, str] | None) -> Iterator[None]:
    if env is None:
        yield
        return
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _no_sigint(self: _cli_run.Sigint) -> Callable[[], None]:
    # Signal handlers belong to the main thread; Ctrl-C is tested on real processes.
    self._main = asyncio.current_task()
    return lambda: None


@contextlib.contextmanager
def _directory(cwd: str | os.PathLike[str] | None) -> Iterator[None]:
    if cwd is None:
        yield
        return
    saved = os.getcwd()
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(saved)


@contextlib.contextmanager
def _stdin(text: str) -> Iterator[None]:
    """stdin read from ``text``: not a terminal."""
    saved = sys.stdin
    sys.stdin = io.StringIO(text)
    try:
        yield
    finally:
        sys.stdin = saved


def _call(
    args: tuple[str, ...], env: dict[str, str] | None, cwd: str | os.PathLike[str] | None
) -> Done:
    out, err = io.StringIO(), io.StringIO()
    install = _cli_run.Sigint.install
    with (
        _one_at_a_time,
        _environment(env),
        _directory(cwd),
        _stdin(""),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        _cli_run.Sigint.install = _no_sigint  # type: ignore[method-assign]
        try:
            code: int | None = cli.main(list(args))
        except SystemExit as exc:  # argparse: --help, --version, a bad argument
            code = exc.code if isinstance(exc.code, int) else 1
        finally:
            _cli_run.Sigint.install = install  # type: ignore[method-assign]
    return Done(code, out.getvalue(), err.getvalue())


async def sessionrt(
    *args: str, env: dict[str, str] | None = None, cwd: str | os.PathLike[str] | None = None
) -> Done:
    """``sessionrt ARGS`` with ``env`` (this process's environment when None), in-process,
    in the working directory ``cwd`` (this process's when None), stdin not a terminal."""
    async with asyncio.timeout(TIMEOUT):
        return await asyncio.to_thread(_call, args, env, cwd)
