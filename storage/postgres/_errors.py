"""Failures of the driver, told without anything that could hold the URL (and its password)."""

from __future__ import annotations

from typing import Final

import asyncpg

from storage.errors import StorageBrokenError

__all__ = ["UNAVAILABLE", "reason"]

#: The server or the connection is not there for now (the same request may
#: work later): the socket's errors, the driver's, a connection the server
#: ended (``08xxx``, and ``57xxx`` such as "terminating connection due to
#: administrator command", which a restart or a failover sends to every
#: session) and a server out of resources (``53xxx``: too many connections).
#: A read that fails so is a StorageBrokenError (a 503), not a 500. The
#: driver's InternalClientError is there too: a pooled connection cut off
#: mid-statement can answer the next one with it ("cannot switch to state
#: 12; another operation is in progress"), seen under crashsim's drops.
UNAVAILABLE: Final = (
    OSError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.InsufficientResourcesError,
)


def reason(exc: BaseException) -> str:
    """What went wrong, without anything that could hold the URL."""
    if isinstance(exc, StorageBrokenError):
        return str(exc)
    if isinstance(exc, asyncpg.PostgresError):
        return f"{type(exc).__name__}: {getattr(exc, 'message', '') or exc.sqlstate}"
    if isinstance(exc, OSError):
        return f"{type(exc).__name__}: {exc.strerror or exc}"
    return type(exc).__name__
