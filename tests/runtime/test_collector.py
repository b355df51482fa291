"""The collector paced for a long run: full passes walk only what arrived since the last one,
and what dies in a cycle while frozen is still reclaimed (actors/collector.py)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from actors.collector import collector_paced


class _Node:
    """A cyclic-garbage candidate that a weak reference can watch."""

    def __init__(self) -> None:
        self.other: object = self


@pytest.fixture(autouse=True)
def _nothing_frozen() -> Iterator[None]:
    """Each test starts with nothing frozen (the suite freezes what collection made:
    tests/conftest.py) and leaves the suite's state as it found it. Only the
    tests' own ``gc.collect()`` calls run passes, so each pass is one they chose."""
    gc.unfreeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()
        gc.freeze()


def test_what_survives_a_full_pass_is_frozen_and_the_next_pass_walks_only_what_came_since() -> None:
    with collector_paced() as pacer:
        kept = [(object(), []) for _ in range(1_000)]  # lists: objects the collector tracks
        gc.collect()
        assert pacer.freezes >= 1
        assert gc.get_objects(generation=2) == []
        frozen = gc.get_freeze_count()
        young = [[] for _ in range(10)]
        gc.collect()
        assert gc.get_freeze_count() >= frozen + len(young)
        del kept, young


def test_leaving_the_last_pacer_gives_every_frozen_object_back_to_the_collector() -> None:
    with collector_paced(), collector_paced():
        gc.collect()
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0


def test_a_cycle_that_dies_while_frozen_is_reclaimed_once_the_frozen_set_has_doubled() -> None:
    with collector_paced(reclaim_floor=0) as pacer:
        node = _Node()
        watch = weakref.ref(node)
        gc.collect()  # the cycle, alive, is frozen
        del node
        gc.collect()
        assert watch() is not None  # frozen: no pass sees it
        grown = [[] for _ in range(2 * gc.get_freeze_count())]
        gc.collect()  # the frozen set has doubled: everything goes back to the collector
        assert pacer.reclaiming
        gc.collect()  # the reclaiming pass
        assert watch() is None
        assert pacer.reclaims == 1
        assert not pacer.reclaiming
        assert gc.get_freeze_count() > 0  # what survived it is frozen again
        del grown
