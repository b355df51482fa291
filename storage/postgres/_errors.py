"""Failures of the driver, told without anything that could hold the URL (and its password)."""

from __future__ import annotations

import asyncpg

from storage.errors import StorageBrokenError

__all__ = ["reason"]


def reason(exc: BaseException) -> str:
    """What went wrong, without anything that could hold the URL."""
    if isinstance(exc, StorageBrokenError):
        return str(exc)
    if isinstance(exc, asyncpg.PostgresError):
        return f"{type(exc).__name__}: {getattr(exc, 'message', '') or exc.sqlstate}"
    if isinstance(exc, OSError):
        return f"{type(exc).__name__}: {exc.strerror or exc}"
    return type(exc).__name__
