"""The live subscribers of one store, told of each committed batch on the loop.

Both backends keep their subscribers here, so "one broken subscriber must not
starve the others or the writer" holds for each the same way. Bounded by
whoever subscribes (each follow dispatcher, metrics, the bus: a handful).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence

from storage.recorder import RecordedEvent, Subscriber

__all__ = ["Subscribers"]

log = logging.getLogger(__name__)


class Subscribers:
    def __init__(self) -> None:
        self._all: list[Subscriber] = []

    def __len__(self) -> int:
        return len(self._all)

    def subscribe(self, subscriber: Subscriber) -> Callable[[], None]:
        self._all.append(subscriber)

        def unsubscribe() -> None:
            with contextlib.suppress(ValueError):
                self._all.remove(subscriber)

        return unsubscribe

    def publish(self, records: Sequence[RecordedEvent]) -> None:
        for subscriber in list(self._all):
            try:
                subscriber(records)
            except Exception:
                # One broken subscriber must not starve the others or the writer.
                log.exception("event subscriber failed")
