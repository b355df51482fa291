"""Embedded sessionrt: the whole runtime in your process, the client API on top.

    async with Embedded(data_dir="./data") as oc:
        session = await oc.sessions.create()
        await oc.sessions.prompt(session.id, PromptInput(text="hello"))
        async for event in oc.sessions.log(session.id, LogQuery(follow=True)):
            ...

``oc.sessions``, ``oc.instructions`` and ``oc.events`` are the very methods of the networked
:class:`~protocol.client.Client`; calls travel over an in-process transport
(:mod:`server._inprocess`) through the same aiohttp routing, middleware,
codecs and errors, without opening a listening socket. Embedded-only extras
sit beside them: ``oc.runtime`` (the running :class:`~actors.runtime.Runtime`).

Closing releases everything it started: client, HTTP server side, runtime
(execution, tool threads, store). It opens once (unopened -> open -> closed).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Self

import attrs

from actors.runtime import Runtime, RuntimeConfig
from actors.tools import Tool
from protocol.client import Client, EventsAPI, InstructionsAPI, ServerAPI, SessionsAPI
from protocol.lifecycle import Lifecycle, LifecycleState
from server._inprocess import InProcessConnector
from server._protocol import make_runner
from server.app import ServerSettings, make_app, runner_options

__all__ = ["Embedded"]

#: Requests never leave the process; the host part only names it.
BASE_URL = "http://sessionrt.embedded"


class Embedded:
    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        config: RuntimeConfig | None = None,
        settings: ServerSettings | None = None,
        tools: Iterable[Tool] = (),
    ) -> None:
        """``tools``: the application's own tools (:func:`actors.tools.tool`),
        offered alongside the built-in ones (added to ``config.tools``)."""
        if (data_dir is None) == (config is None):
            raise ValueError("pass exactly one of data_dir or config")
        config = config or RuntimeConfig(data_dir=Path(os.fspath(data_dir)))  # type: ignore[arg-type]
        extra = tuple(tools)
        self.config = attrs.evolve(config, tools=config.tools + extra) if extra else config
        self._settings = settings or ServerSettings()
        self._lifecycle = Lifecycle("embedded host")
        self._stack = contextlib.AsyncExitStack()
        self._runtime: Runtime | None = None
        self._client: Client | None = None

    @property
    def runtime(self) -> Runtime:
        if self._runtime is None:
            raise RuntimeError(f"embedded host is {self._lifecycle.state.value}")
        return self._runtime

    @property
    def sessions(self) -> SessionsAPI:
        return self._open_client().sessions

    @property
    def instructions(self) -> InstructionsAPI:
        return self._open_client().instructions

    @property
    def events(self) -> EventsAPI:
        return self._open_client().events

    @property
    def server(self) -> ServerAPI:
        return self._open_client().server

    def _open_client(self) -> Client:
        if self._client is None:
            raise RuntimeError(f"embedded host is {self._lifecycle.state.value}")
        return self._client

    async def __aenter__(self) -> Self:
        self._lifecycle.open()
        try:
            runtime = await self._stack.enter_async_context(Runtime(self.config))
            self._runtime = runtime
            app = make_app(runtime=runtime, settings=self._settings)
            runner = make_runner(app, **runner_options(self._settings))
            await runner.setup()
            self._stack.push_async_callback(runner.cleanup)
            assert runner.server is not None
            connector = InProcessConnector(runner.server)
            self._stack.push_async_callback(connector.close)
            client = Client(BASE_URL, connector=connector, timeout=None)
            self._client = await self._stack.enter_async_context(client)
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._lifecycle.close() is LifecycleState.CLOSED:
            return
        try:
            await self._stack.aclose()
        finally:
            self._client = None
            self._runtime = None
