"""Guards for every actor test: no task left behind, nothing reported to the loop.

Leaked tasks and "exception was never retrieved" are exactly the bugs an actor
core can have without any assertion failing, so every test checks for them.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from typing import Any

import pytest


@pytest.fixture(autouse=True)
async def loop_hygiene() -> AsyncIterator[None]:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    yield
    # A dropped future with an unread exception only reports when it is collected.
    gc.collect()
    loop.set_exception_handler(previous)
    leftover = asyncio.all_tasks() - {asyncio.current_task()}
    assert not leftover, f"tasks outlived the test: {leftover}"
    assert not reported, f"the loop's exception handler was called: {reported}"
