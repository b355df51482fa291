"""The machinery behind ``sessionrt run`` and ``sessionrt log``.

A *host* is what the commands talk to: an :class:`~server.embedded.Embedded`
runtime on a data directory, or a :class:`~protocol.client.Client` of a
running server (``--url``). Both expose the same ``sessions`` and ``events``
groups, so everything below is written once against them.

``run`` admits a prompt and follows it to the end of its busy period. Two
sources feed the output: the instance feed (``events.subscribe``, opened
*before* the prompt is admitted, so no delta is missed) for the live text
deltas, and the session's durable log (from the seq just before the
admission) for the facts that decide the outcome. The run is over at the
first terminal execution event after the prompt was admitted: ``succeeded``
once the prompt has been delivered, ``failed`` or ``interrupted`` at once.

A tool call that asks for permission (``session.permission.asked``) is asked
on the terminal when stdin is one: ``y`` (once), ``a`` (always, for this
session), ``n`` (reject). Without a terminal the request is left pending and
``run`` prints how to answer it over HTTP; with an embedded host nobody else
can answer it, so ``run`` then interrupts the run (the call fails as
``aborted``, never run) and exits 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import urllib.parse
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, Final, Protocol, TextIO, TypeVar

import attrs

from actors.runtime import RuntimeConfig
from protocol import codec
from protocol.client import (
    Client,
    ClientError,
    EventsAPI,
    EventStream,
    InstructionsAPI,
    SessionsAPI,
    SSEEvent,
    follow_log,
)
from protocol.errors import SessionRtError
from protocol.operations import AgentInput, LogQuery, ModelInput, PermissionReplyInput
from protocol.requests import CreateSessionInput, PromptInput
from protocol.shapes import ModelRef
from server._cli_render import Renderer
from server.embedded import Embedded

__all__ = ["Host", "RunOptions", "Sigint", "open_host", "run"]

T = TypeVar("T")

#: An ``after`` beyond any seq: the log answers with nothing but ``log.synced`` at its head.
_BEYOND: Final = 2**53
_INTERRUPT_TIMEOUT_S: Final = 5.0
_TERMINALS: Final = frozenset(
    {"session.execution.succeeded", "session.execution.failed", "session.execution.interrupted"}
)


class Host(Protocol):
    """What the commands need of an embedded host or a client."""

    @property
    def sessions(self) -> SessionsAPI: ...

    @property
    def instructions(self) -> InstructionsAPI: ...

    @property
    def events(self) -> EventsAPI: ...


@contextlib.asynccontextmanager
async def open_host(
    url: str | None,
    password: str | None,
    data_dir: Path,
    config: RuntimeConfig | None = None,
    *,
    directory: str | None = None,
) -> AsyncIterator[Host]:
    """A client of ``url`` (Bearer ``password``), or else an embedded host on ``data_dir``
    (with ``config``'s settings when given).

    With ``url``, ``directory`` (the caller's working directory) goes with every
    request as the released client sends it, URL-encoded in
    ``x-opencode-directory``: a session the command creates lives there, not
    in the server's directory. The server checks it like any client-named
    directory (absolute, existing, not ``/``, not its data directory).
    """
    if url:
        headers: dict[str, str] = {}
        if password:
            headers["Authorization"] = f"Bearer {password}"
        if directory is not None:
            headers["x-opencode-directory"] = urllib.parse.quote(directory, safe="/")
        async with Client(url, headers=headers) as client:
            yield client
        return
    async with Embedded(config=config or RuntimeConfig(data_dir=data_dir)) as embedded:
        yield embedded


class Sigint:
    """Ctrl-C for a command: the first cancels the guarded work (else the command), a second
    exits at once with 130."""

    def __init__(self) -> None:
        self.fired = False
        self._targets: list[asyncio.Task[Any]] = []
        self._main: asyncio.Task[Any] | None = None

    def install(self) -> Callable[[], None]:
        """Take SIGINT for the running task; returns the function that gives it back."""
        loop = asyncio.get_running_loop()
        self._main = asyncio.current_task()
        loop.add_signal_handler(signal.SIGINT, self._fire)

        def release() -> None:
            loop.remove_signal_handler(signal.SIGINT)

        return release

    def _fire(self) -> None:
        if self.fired:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
            os._exit(130)
        self.fired = True
        target = self._targets[-1] if self._targets else self._main
        if target is not None:
            target.cancel()

    async def guard(self, work: Coroutine[Any, Any, T]) -> T | None:
        """Run ``work``; ``None`` when Ctrl-C cancelled it (its result otherwise)."""
        task = asyncio.ensure_future(work)
        self._targets.append(task)
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if self.fired and task.cancelled() and not (current and current.cancelling()):
                return None
            raise
        finally:
            self._targets.remove(task)


@attrs.frozen(kw_only=True)
class RunOptions:
    text: str
    session_id: str | None = None
    agent: str | None = None
    model: ModelRef | None = None
    queue: bool = False
    follow: bool = True
    #: A server runs what is admitted; an embedded host only runs it while it is open.
    remote: bool = False


async def run(
    host: Host,
    options: RunOptions,
    sigint: Sigint,
    out: TextIO,
    err: TextIO,
    stdin: TextIO | None = None,
) -> int:
    """``sessionrt run``: admit the prompt and (following) show the run; the exit code."""
    asker = _Asker(host, stdin if stdin is not None else sys.stdin, remote=options.remote)
    session_id = await _prepare_session(host, options)
    print(f"session {session_id}", file=err, flush=True)
    if not options.follow:
        # Embedded, nothing would run it before this process exits: admit it only.
        receipt = await host.sessions.prompt(session_id, _prompt(options, resume=options.remote))
        print(json.dumps(codec.to_json(receipt), ensure_ascii=False), file=out, flush=True)
        if not options.remote:
            print(
                "sessionrt: admitted only; it runs with the session's next run"
                " (use --url to hand it to a server)",
                file=err,
            )
        return 0
    watermark = await _watermark(host, session_id)
    renderer = Renderer(out, err, spinner=_isatty(err))
    feed = host.events.subscribe()
    helpers: list[asyncio.Task[None]] = []
    try:
        await _connected(feed)
        helpers.append(asyncio.create_task(_pump_feed(feed, session_id, renderer)))
        helpers.append(asyncio.create_task(renderer.spin()))
        code = await sigint.guard(
            _admit_and_follow(host, options, session_id, watermark, renderer, asker)
        )
        if code is not None:
            return code
        renderer.close()
        await _interrupt(host, session_id)
        renderer.note("sessionrt: interrupted")
        return 130
    finally:
        for task in helpers:
            task.cancel()
        await asyncio.gather(*helpers, return_exceptions=True)
        await feed.aclose()
        renderer.close()


def _prompt(options: RunOptions, *, resume: bool = True) -> PromptInput:
    return PromptInput(
        text=options.text, delivery="queue" if options.queue else "steer", resume=resume
    )


async def _prepare_session(host: Host, options: RunOptions) -> str:
    if options.session_id is None:
        created = await host.sessions.create(
            CreateSessionInput(agent=options.agent, model=options.model)
        )
        return created.id
    session = await host.sessions.get(options.session_id)
    if options.agent is not None:
        await host.sessions.switch_agent(session.id, AgentInput(agent=options.agent))
    if options.model is not None:
        await host.sessions.switch_model(session.id, ModelInput(model=options.model))
    return session.id


async def _watermark(host: Host, session_id: str) -> int:
    """The session's latest seq."""
    async with host.sessions.log(session_id, LogQuery(after=_BEYOND)) as stream:
        async for event in stream:
            if event.event == "log.synced" and isinstance(event.data, Mapping):
                seq = event.data.get("seq")
                return seq if isinstance(seq, int) else 0
    return 0


async def _connected(feed: EventStream) -> None:
    """Wait for ``server.connected``: from then on the feed misses nothing."""
    async for event in feed:
        if event.event == "server.connected":
            return
    raise ClientError("malformed_response", "the event feed ended before it connected")


async def _pump_feed(feed: EventStream, session_id: str, renderer: Renderer) -> None:
    # A feed that fails or is dropped loses only the live preview: the log completes the text.
    with contextlib.suppress(SessionRtError):
        async for event in feed:
            data = _data(event)
            if data is not None and data.get("sessionID") == session_id:
                _show(event.event, data, renderer)


async def _admit_and_follow(
    host: Host,
    options: RunOptions,
    session_id: str,
    after: int,
    renderer: Renderer,
    asker: _Asker,
) -> int:
    receipt = await host.sessions.prompt(session_id, _prompt(options))
    outcome = _Outcome(inbox_id=receipt.id)
    events = follow_log(host.sessions, session_id, after)
    async with contextlib.aclosing(events):
        async for event in events:
            data = _data(event)
            if data is None:
                continue
            _show(event.event, data, renderer)
            if event.event == "session.permission.asked":
                if not await asker.ask(session_id, data, renderer):
                    await _interrupt(host, session_id)
                    return 1
                continue
            code = outcome.on(event.event, data, renderer)
            if code is not None:
                return code
    renderer.note("sessionrt: the session log ended before the run finished")
    return 1


_REPLIES: Final[Mapping[str, Any]] = {
    "y": "once",
    "yes": "once",
    "o": "once",
    "once": "once",
    "a": "always",
    "always": "always",
    "n": "reject",
    "no": "reject",
    "r": "reject",
    "reject": "reject",
}


class _Asker:
    """Answers permission requests on the terminal (see the module docstring)."""

    def __init__(self, host: Host, stdin: TextIO, *, remote: bool) -> None:
        self._host = host
        self._stdin = stdin
        self._remote = remote

    async def ask(self, session_id: str, data: Mapping[str, Any], renderer: Renderer) -> bool:
        """Ask about one request; False when it cannot be answered and the run must end."""
        permission_id = str(data.get("id", ""))
        patterns = data.get("patterns")
        what = ", ".join(str(p) for p in patterns) if isinstance(patterns, list) else ""
        renderer.note(
            f"? permission {data.get('permission')} for {data.get('tool')}: "
            f"{data.get('summary', '')}" + (f" [{what}]" if what else "")
        )
        if not _isatty(self._stdin):
            renderer.note(
                f"sessionrt: permission {permission_id} waits for an answer: POST"
                f" /api/session/{session_id}/permission/{permission_id}"
                ' {"reply": "once" | "always" | "reject"}'
            )
            if not self._remote:
                renderer.note("sessionrt: no terminal to answer it here; interrupting the run")
            return self._remote
        while True:
            renderer.note("  allow? [y] once, [a] always (this session), [n] reject: ")
            line = await _read_line(self._stdin)
            if line is None:  # end of input: nobody will answer
                return self._remote
            reply = _REPLIES.get(line.strip().lower())
            if reply is not None:
                break
        try:
            await self._host.sessions.reply_permission(
                session_id, permission_id, PermissionReplyInput(reply=reply)
            )
        except SessionRtError as exc:
            renderer.note(f"sessionrt: {exc}")  # answered elsewhere, or its call settled
        return True


async def _read_line(stream: TextIO) -> str | None:
    """One line typed on the terminal ``stream``, without a thread; None at end of input."""
    loop = asyncio.get_running_loop()
    fd = stream.fileno()
    done: asyncio.Future[bytes] = loop.create_future()

    def readable() -> None:
        if not done.done():
            try:
                done.set_result(os.read(fd, 4096))
            except OSError:
                done.set_result(b"")

    loop.add_reader(fd, readable)
    try:
        chunk = await done
    finally:
        loop.remove_reader(fd)
    return chunk.decode(errors="replace") if chunk else None


@attrs.define
class _Outcome:
    """Reads the durable log for the end of this prompt's busy period."""

    inbox_id: str
    admitted: bool = False
    delivered: bool = False

    def on(self, type_: str | None, data: Mapping[str, Any], renderer: Renderer) -> int | None:
        mine = data.get("inboxID") == self.inbox_id
        if type_ == "session.inbox.enqueued" and mine:
            self.admitted = True
        elif type_ == "session.inbox.delivered" and mine:
            self.delivered = True
        elif type_ == "session.inbox.cancelled" and mine:
            renderer.note("sessionrt: the prompt was cancelled before it ran")
            return 1
        elif type_ == "session.deleted":
            renderer.note("sessionrt: the session was deleted")
            return 1
        elif type_ in _TERMINALS and self.admitted:
            return self._terminal(type_, data, renderer)
        return None

    def _terminal(
        self, type_: str | None, data: Mapping[str, Any], renderer: Renderer
    ) -> int | None:
        if type_ == "session.execution.succeeded":
            # A busy period that ended before taking the prompt is not this prompt's.
            return 0 if self.delivered else None
        if type_ == "session.execution.failed":
            error = data.get("error")
            error = error if isinstance(error, Mapping) else {}
            kind, message = error.get("type", "error"), error.get("message", "")
            renderer.note(f"sessionrt: run failed: {kind}: {message}")
            return 1
        renderer.note(f"sessionrt: run interrupted ({data.get('reason', 'unknown')})")
        return 1


def _show(type_: str | None, data: Mapping[str, Any], renderer: Renderer) -> None:
    """Render one session event's data; the same fact from either source prints once."""
    message_id = str(data.get("assistantMessageID", ""))
    if type_ == "session.text.delta":
        renderer.text_delta(message_id, _int(data.get("ordinal")), str(data.get("delta", "")))
    elif type_ == "session.text.ended":
        renderer.text_ended(message_id, _int(data.get("ordinal")), str(data.get("text", "")))
    elif type_ == "session.reasoning.delta":
        renderer.reasoning_delta(message_id, _int(data.get("ordinal")), str(data.get("delta", "")))
    elif type_ == "session.reasoning.ended":
        renderer.reasoning_ended(message_id, _int(data.get("ordinal")), str(data.get("text", "")))
    elif type_ == "session.tool.called":
        tool_input = data.get("input")
        renderer.tool_called(
            str(data.get("id")),
            str(data.get("name")),
            tool_input if isinstance(tool_input, Mapping) else {},
        )
    elif type_ == "session.tool.success":
        metadata = data.get("metadata")
        renderer.tool_succeeded(
            str(data.get("id")), metadata if isinstance(metadata, Mapping) else None
        )
    elif type_ == "session.tool.failed":
        error = data.get("error")
        renderer.tool_failed(str(data.get("id")), error if isinstance(error, Mapping) else {})


def _data(event: SSEEvent) -> Mapping[str, Any] | None:
    """The ``data`` member of an event envelope."""
    if not isinstance(event.data, Mapping):
        return None
    data = event.data.get("data")
    return data if isinstance(data, Mapping) else None


def _int(value: object) -> int:
    return value if isinstance(value, int) else 0


async def _interrupt(host: Host, session_id: str) -> None:
    with contextlib.suppress(SessionRtError, TimeoutError):
        async with asyncio.timeout(_INTERRUPT_TIMEOUT_S):
            await host.sessions.interrupt(session_id)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
