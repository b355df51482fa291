"""One open/closed lifecycle for the resources that are async context managers.

A store, the runtime, the embedded host, the blocking executor, the tool pool
and the Python client each open once and close once (httpx's ``ClientState``)::

    unopened ──open()──▶ open ──begin_close()──▶ closing ──closed()──▶ closed
        └──────────────────┴──────close()───────────────────────────────▲

A second open, or a use when not open, raises the resource's own error type
with a message naming the resource and its state. ``begin_close``/``closed``
suit a close that awaits its release (a use meanwhile sees ``closing``);
``close`` is the one-step form, which answers the state it left so the caller
knows whether there was anything to release.
"""

from __future__ import annotations

import enum

__all__ = ["Lifecycle", "LifecycleState"]


class LifecycleState(enum.Enum):
    UNOPENED = "unopened"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


class Lifecycle:
    """The state of one resource called ``what``; refusals raise ``error``."""

    __slots__ = ("_error", "_what", "state")

    def __init__(self, what: str, error: type[Exception] = RuntimeError) -> None:
        self._what = what
        self._error = error
        self.state = LifecycleState.UNOPENED

    @property
    def is_open(self) -> bool:
        return self.state is LifecycleState.OPEN

    def open(self) -> None:
        if self.state is not LifecycleState.UNOPENED:
            raise self._error(f"{self._what} is {self.state.value}; it opens once")
        self.state = LifecycleState.OPEN

    def check_open(self) -> None:
        if self.state is not LifecycleState.OPEN:
            raise self._error(f"{self._what} is {self.state.value}")

    def begin_close(self) -> bool:
        """Enter ``closing``; False when closing or closed already (a close runs once)."""
        if self.state in (LifecycleState.CLOSING, LifecycleState.CLOSED):
            return False
        self.state = LifecycleState.CLOSING
        return True

    def closed(self) -> None:
        self.state = LifecycleState.CLOSED

    def close(self) -> LifecycleState:
        """Close at once; the state it was in."""
        before, self.state = self.state, LifecycleState.CLOSED
        return before
