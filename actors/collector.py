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
cost, kept bounded: once the passes since the last reclaiming one have frozen
as many objects as the heap held then (and at least :data:`RECLAIM_FLOOR`),
everything is given back to the collector (``gc.unfreeze()``) for its next
full pass, which walks it all once and frees any such cycle. That long pass is
what every full pass used to be; it now comes once per million objects frozen
or so (with 100 sessions stepping a full pass keeps 5,000 to 25,000: one long
pass in 40 to 200), not every time the oldest generation grew by a quarter.
The runtime makes no cycles per turn (``tests/runtime/test_memory.py``), so
what it frees is little.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator
from typing import Any, Final

__all__ = ["RECLAIM_FLOOR", "CollectorPacer", "collector_paced", "collector_paused"]

#: The least number of objects frozen since the last reclaiming pass that makes the
#: next one due (see :class:`CollectorPacer`).
RECLAIM_FLOOR: Final = 1_000_000

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
    """The ``gc.callbacks`` entry of :func:`collector_paced` (one per process).

    It never asks how many objects are frozen (``gc.get_freeze_count()`` walks
    the whole frozen list: 12 ms for 96,000 objects, as long as the pass it
    would spare). It counts what each freeze adds instead, the survivors of the
    pass just made (walked by it already); some of them die later, so the count
    overstates the frozen set's growth, and a reclaiming pass comes at worst
    once per :data:`RECLAIM_FLOOR` objects frozen, or per the heap's own size
    when that is more.
    """

    def __init__(self, reclaim_floor: int = RECLAIM_FLOOR) -> None:
        self.reclaim_floor = reclaim_floor
        #: What was frozen before the pacer came (the application's own, if any).
        self.frozen_before = gc.get_freeze_count()
        #: Objects frozen at the last reclaiming pass (or when hosts entered).
        self.after_reclaim = self.frozen_before
        #: Objects frozen since: the survivors of every full pass, summed.
        self.added = 0
        self.reclaiming = False
        #: Full passes whose survivors were frozen, and reclaiming passes.
        self.freezes = 0
        self.reclaims = 0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase != "stop" or info["generation"] != 2:
            return
        # Right after a full pass the younger generations are empty: this is
        # everything the pass kept, and all of it was just found reachable.
        survivors = len(gc.get_objects(generation=2))
        if self.reclaiming:
            self.reclaiming = False
            self.reclaims += 1
            self.after_reclaim, self.added = survivors, 0
            gc.freeze()
            return
        if self.added + survivors > max(self.after_reclaim, self.reclaim_floor):
            # Everything back in the oldest generation: the next full pass
            # walks it all once and frees what died in cycles while frozen.
            gc.unfreeze()
            self.reclaiming = True
            return
        gc.freeze()
        self.freezes += 1
        self.added += survivors


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
