"""Finishing work that must not be cut in half by a cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["finish"]

T = TypeVar("T")


async def finish(work: Awaitable[T]) -> T:
    """Run ``work`` to completion even if the caller is cancelled meanwhile.

    Durable bookkeeping (an execution's start or terminal, a tool's failed
    terminal after an interrupt) must land whole; a cancellation that arrives
    while it runs is re-raised once it is done.
    """
    task = asyncio.ensure_future(work)
    cancelled = False
    while True:
        try:
            await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.done():
                break
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return task.result()
