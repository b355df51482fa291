"""The Python client of the sessionrt HTTP API, derived from the operation table.

    async with Client("http://127.0.0.1:4096") as client:
        session = await client.sessions.create()
        receipt = await client.sessions.prompt(session.id, PromptInput(text="hi"))
        async with client.sessions.log(session.id, LogQuery(follow=True)) as events:
            async for event in events:
                ...

Construction does no I/O; ``async with`` opens the client (an aiohttp
``ClientSession``) and closing it closes the session and any stream still
open. The state goes unopened -> open -> closed, once: calling an unopened or
closed client raises ``ClientError(reason="closed")``, opening it twice
raises ``RuntimeError``.

Methods live in capability groups (``client.sessions``, ``client.events``),
generated from :data:`protocol.operations.OPERATIONS` into
``protocol/_generated_client.py`` by ``scripts/gen_client.py``. Each takes
path parameters (``session_id``…), then the domain ``input`` (body) or
``query``, and per-call transport options apart: ``options=CallOptions(timeout=…,
headers=…)``. Cancel a call by cancelling the task awaiting it.

Failures: a declared error the server sent (``SessionNotFoundError``,
``ConflictError``… from :mod:`protocol.errors`, told apart by ``.tag`` and
carrying ``.fields``) is raised as that class; anything else is a
:class:`ClientError` whose ``reason`` says what went wrong::

    SessionRtError
    ├── DomainError                     the server's tagged answer (protocol.errors)
    └── ClientError(reason=…, status=…)
          "closed"                      the client is not open
          "transport"                   connect/read failed, or the call timed out
          "unexpected_status"           a status that is neither success nor a known tag
          "unsupported_content_type"    a success whose body is not JSON / an event stream
          "malformed_response"          a body that does not parse or has the wrong shape

Streaming operations (``sessions.log``, ``events.subscribe``) return an
:class:`EventStream` at once (no ``await``); iterating it connects and yields
:class:`SSEEvent` values. Streams never reconnect on their own;
:func:`follow_log` is the recipe for resuming a session's log.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from types import TracebackType
from typing import Self

import aiohttp

from protocol._client_http import CallOptions, ClientError, Connection, Reason
from protocol._client_stream import EventStream
from protocol._generated_client import (
    EventsAPI,
    InstructionsAPI,
    OperationGroups,
    ServerAPI,
    SessionsAPI,
)
from protocol.lifecycle import LifecycleState
from protocol.operations import LogQuery
from protocol.sse import SSEEvent

__all__ = [
    "CallOptions",
    "Client",
    "ClientError",
    "EventStream",
    "EventsAPI",
    "InstructionsAPI",
    "LifecycleState",
    "Reason",
    "SSEEvent",
    "ServerAPI",
    "SessionsAPI",
    "follow_log",
]


class Client(OperationGroups):
    """A client of one sessionrt server; an async context manager, opened once.

    ``connector`` lets a host supply the transport (the embedded host passes
    an in-process connector); the client does not close a connector it was
    given unless ``connector_owner=True``. ``timeout`` (seconds, ``None`` for
    none) bounds each call, and the opening of each stream; ``headers`` go
    with every request, under any per-call ``CallOptions.headers``.
    """

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str] | None = None,
        connector: aiohttp.BaseConnector | None = None,
        connector_owner: bool = False,
        timeout: float | None = 60,
    ) -> None:
        self._connection = Connection(
            base_url,
            headers=headers,
            connector=connector,
            connector_owner=connector_owner,
            timeout=timeout,
        )
        super().__init__(self._connection)

    @property
    def state(self) -> LifecycleState:
        return self._connection.state

    @property
    def base_url(self) -> str:
        return str(self._connection.base_url)

    async def __aenter__(self) -> Self:
        self._connection.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the client and every stream it still has open; idempotent."""
        await self._connection.close()

    def __repr__(self) -> str:
        return f"<Client {self.base_url} {self.state.value}>"


async def _backoff(attempt: int) -> None:
    await asyncio.sleep(min(0.1 * 2 ** (attempt - 1), 5.0))


async def follow_log(
    sessions: SessionsAPI,
    session_id: str,
    after: int = 0,
    *,
    follow: bool = True,
    retries: int = 5,
    backoff: Callable[[int], Awaitable[None]] = _backoff,
    options: CallOptions | None = None,
) -> AsyncGenerator[SSEEvent, None]:
    """Follow a session's durable log from ``after``, resuming after a lost connection.

    Takes a client's ``sessions`` group (``client.sessions``, or an embedded
    host's ``oc.sessions``). Without ``follow`` it is one replay up to the
    ``log.synced`` marker, and a lost connection is raised, not resumed.

    The resume recipe, built only on the public client: ``sessions.log`` never
    reconnects, so this keeps the ``seq`` (the SSE ``id``) of the last durable
    event it yielded and, when the stream fails with
    ``ClientError(reason="transport")``, awaits ``backoff(attempt)`` and opens
    ``sessions.log(session_id, LogQuery(after=last_seq, follow=True))`` again.
    Events at or below ``last_seq`` are skipped, so each durable event is
    yielded once. Each resumed stream starts with its own ``log.synced``
    frame, which is yielded too.

    ``retries`` bounds consecutive failures (a durable event resets the
    count); past it, the last ``ClientError`` propagates, as does any other
    error (a ``SessionNotFoundError``, a closed client). A stream the server
    ends cleanly ends the iteration.

    Close it when done early (``async with contextlib.aclosing(follow_log(...))``),
    so the open stream is closed at once rather than when the generator is collected.
    """
    last_seq = after
    failures = 0
    while True:
        stream = sessions.log(session_id, LogQuery(after=last_seq, follow=follow), options=options)
        try:
            async for event in stream:
                if event.id is not None:
                    if event.id <= last_seq:
                        continue
                    last_seq = event.id
                    failures = 0
                yield event
            return
        except ClientError as exc:
            if not follow or exc.reason != "transport" or failures >= retries:
                raise
            failures += 1
        finally:
            await stream.aclose()
        await backoff(failures)
