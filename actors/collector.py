"""Python's cycle collector around the runtime: paused for bulk jobs, paced for a long run.

**Paused.** An import of 200,000 messages holds a few million objects at once (the
parsed document, the decoded messages, their events and records; none in a
cycle: reference counting frees them), and the collector's full passes over
them stopped every thread, the event loop's included, for 0.2 to 0.5 s each,
six times per import (measured with ``scripts/bench_import.py``).
:func:`collector_paused` turns the collector off for such a job: nested or
concurrent jobs share one pause, and the collector's state before the first
is back after the last. Only for bounded jobs (an import's body is capped by
``max_body_bytes``): meanwhile, cyclic garbage elsewhere waits for the end.

**Paced.** A full (generation 2) pass walks every object the collector tracks,
and a long-running host keeps tens of thousands of them alive in its bounded
caches (decoded messages, converted histories): 100 sessions stepping held
45,000 and a full pass stopped the loop for 30 to 70 ms of CPU
(``scripts/bench_runtime.py --stalls``), whatever the pass found. Those objects
are immutable values freed by reference counting; walking them again finds
nothing. :func:`collector_paced` (the hosts' choice: ``sessionrt serve`` and
the embedded host) freezes what survives each full pass (``gc.freeze()``, at
the end of the pass, when everything still tracked was just found reachable),
so the next full pass walks only what arrived since. A frozen object freed by
reference counting leaves the frozen set as it would any generation; one that
later dies in a reference cycle is not reclaimed while frozen, and that is the
cost, kept bounded: when the frozen set has grown past twice its size after
the last reclaiming pass (and by :data:`RECLAIM_FLOOR` objects), everything is
given back to the collector (``gc.unfreeze()``) for its next full pass, which
walks it all once and frees any such cycle. The runtime makes no cycles per
turn (``tests/runtime/test_memory.py``), so in a steady state the frozen set
stays the size of the caches and that long pass does not come back.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator
from typing import Any, Final

__all__ = ["RECLAIM_FLOOR", "CollectorPacer", "collector_paced", "collector_paused"]

#: The least growth of the frozen set, in objects, that makes a reclaiming pass due.
RECLAIM_FLOOR: Final = 200_000

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


class CollectorPacer:
    """The ``gc.callbacks`` entry of :func:`collector_paced` (one per process)."""

    def __init__(self, reclaim_floor: int = RECLAIM_FLOOR) -> None:
        self.reclaim_floor = reclaim_floor
        #: What was frozen before the pacer came (the application's own, if any).
        self.frozen_before = gc.get_freeze_count()
        #: The frozen set's size after the last reclaiming pass (or the install).
        self.after_reclaim = self.frozen_before
        self.reclaiming = False
        #: Full passes whose survivors were frozen, and reclaiming passes.
        self.freezes = 0
        self.reclaims = 0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase != "stop" or info["generation"] != 2:
            return
        if self.reclaiming:
            self.reclaiming = False
            self.reclaims += 1
            gc.freeze()
            self.after_reclaim = gc.get_freeze_count()
            return
        frozen = gc.get_freeze_count()
        if frozen > max(2 * self.after_reclaim, self.after_reclaim + self.reclaim_floor):
            # Everything back in the oldest generation: the next full pass
            # walks it all once and frees what died in cycles while frozen.
            gc.unfreeze()
            self.reclaiming = True
            return
        gc.freeze()
        self.freezes += 1


_pacer: CollectorPacer | None = None
_paced = 0


@contextlib.contextmanager
def collector_paced(reclaim_floor: int = RECLAIM_FLOOR) -> Iterator[CollectorPacer]:
    """Full collections paced as the module docstring says, for the block.

    Entering freezes what is tracked now: a host enters once started, and what
    start-up made lives as long as it. Hosts in one process share one pacer.
    When the last leaves, every frozen object is given back to the collector
    (``gc.unfreeze()``) if nothing was frozen before the first came: an
    application embedding the runtime gets its collector as it was. One that
    froze objects of its own keeps them frozen, and with them what the hosts
    froze (the collector cannot tell the two apart).
    """
    global _pacer, _paced
    with _paused_lock:
        if _pacer is None:
            _pacer = CollectorPacer(reclaim_floor)
            gc.callbacks.append(_pacer)
        gc.freeze()
        _pacer.after_reclaim = max(_pacer.after_reclaim, gc.get_freeze_count())
        pacer = _pacer
        _paced += 1
    try:
        yield pacer
    finally:
        with _paused_lock:
            _paced -= 1
            if _paced == 0:
                gc.callbacks.remove(pacer)
                _pacer = None
                if pacer.frozen_before == 0:
                    gc.unfreeze()
