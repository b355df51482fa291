"""The instance feed: every public event of this process, durable and live-only.

Durable events arrive from the store after COMMIT; live-only events (text and
reasoning deltas, tool input deltas, tool progress) are published here and
never stored. Subscribers are plain callables run on the event loop; the
SSE layer gives each connection its own bounded queue on top of this.
No replay: an event published before a subscriber joined is not seen.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence

from protocol import ids
from protocol.events import Event, EventEnvelope, envelope
from storage import RecordedEvent, Recorder, now_ms

__all__ = ["EventBus"]

log = logging.getLogger(__name__)


class EventBus:
    def __init__(self, recorder: Recorder | None = None) -> None:
        """``recorder``: whose committed events to forward (subscribed here, until
        :meth:`close`; a store takes subscribers before it opens)."""
        self._subscribers: list[Callable[[EventEnvelope], None]] = []
        self._detach: Callable[[], None] | None = (
            None if recorder is None else recorder.subscribe(self._committed)
        )

    def close(self) -> None:
        if self._detach is not None:
            self._detach()
            self._detach = None
        self._subscribers.clear()

    def subscribe(self, subscriber: Callable[[EventEnvelope], None]) -> Callable[[], None]:
        self._subscribers.append(subscriber)

        def unsubscribe() -> None:
            with contextlib.suppress(ValueError):
                self._subscribers.remove(subscriber)

        return unsubscribe

    @property
    def listening(self) -> bool:
        """Whether anyone would receive a live event now (else there is no need to make one)."""
        return bool(self._subscribers)

    def live(self, event: Event) -> None:
        """Publish a live-only event (no ``durable`` member, never stored)."""
        if self._subscribers:
            self._publish(envelope(id=ids.event_id(), created=now_ms(), event=event, seq=None))

    def _committed(self, records: Sequence[RecordedEvent]) -> None:
        if not self._subscribers:
            return
        for record in records:
            if record.event is not None:
                self._publish(
                    envelope(
                        id=record.id, created=record.created, event=record.event, seq=record.seq
                    )
                )

    def _publish(self, message: EventEnvelope) -> None:
        for subscriber in list(self._subscribers):
            try:
                subscriber(message)
            except Exception:
                log.exception("event bus subscriber failed")
