"""Pausing Python's cycle collector while a bulk job holds millions of objects.

An import of 200,000 messages holds a few million objects at once (the
parsed document, the decoded messages, their events and records; none in a
cycle: reference counting frees them), and the collector's full passes over
them stopped every thread, the event loop's included, for 0.2 to 0.5 s each,
six times per import (measured with ``scripts/bench_import.py``).
:func:`collector_paused` turns the collector off for such a job: nested or
concurrent jobs share one pause, and the collector's state before the first
is back after the last. Only for bounded jobs (an import's body is capped by
``max_body_bytes``): meanwhile, cyclic garbage elsewhere waits for the end.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

__all__ = ["collector_paused"]

_paused = 0
_was_enabled = False
_paused_lock = threading.Lock()


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cycle collector off for the block (see the module docstring)."""
    global _paused, _was_enabled
    with _paused_lock:
        if _paused == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _paused += 1
    try:
        yield
    finally:
        with _paused_lock:
            _paused -= 1
            if _paused == 0 and _was_enabled:
                gc.enable()
