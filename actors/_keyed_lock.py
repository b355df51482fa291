"""A mutex per key (session id) that forgets keys nobody holds or waits for."""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Final

__all__ = ["MAX_GENERATIONS", "KeyedLock"]

#: Keys whose last release is remembered, by count (least recently released
#: out first); a forgotten key reads as released at the newest forgotten release.
MAX_GENERATIONS: Final = 4096


class KeyedLock:
    def __init__(self, max_generations: int = MAX_GENERATIONS) -> None:
        # key -> (lock, holders + waiters); an entry lives only while in use,
        # so ten thousand idle sessions cost nothing here.
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self._releases = 0
        self._released: dict[str, int] = {}
        self._forgotten = 0
        self._max_generations = max_generations

    def hold(self, key: str) -> _Hold:
        """``async with locks.hold(key):`` holds ``key``'s mutex for the block.

        A class rather than an ``asynccontextmanager``: a prompt and a
        promotion take it at every step, and the generator-based form cost
        several times the lock itself.
        """
        return _Hold(self, key)

    def _enter(self, key: str) -> asyncio.Lock:
        lock, users = self._locks.get(key, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._locks[key] = (lock, users + 1)
        return lock

    def _leave(self, key: str) -> None:
        lock, users = self._locks[key]
        if users == 1:
            del self._locks[key]
        else:
            self._locks[key] = (lock, users - 1)

    def generation(self, key: str) -> int:
        """A number that grows whenever a holder of ``key`` lets it go.

        Equal at two moments, it means nobody released ``key`` in between, so
        whatever the holders change under it is as it was; a larger one may
        be spurious (the key was forgotten), never a smaller one.
        """
        return self._released.get(key, self._forgotten)

    def _release(self, key: str) -> None:
        self._releases += 1
        self._released.pop(key, None)
        self._released[key] = self._releases
        if len(self._released) > self._max_generations:
            oldest = next(iter(self._released))
            self._forgotten = max(self._forgotten, self._released.pop(oldest))

    def __len__(self) -> int:
        return len(self._locks)


class _Hold:
    """One holding of one key (see :meth:`KeyedLock.hold`)."""

    __slots__ = ("_key", "_lock", "_owner")

    def __init__(self, owner: KeyedLock, key: str) -> None:
        self._owner = owner
        self._key = key
        self._lock: asyncio.Lock | None = None

    async def __aenter__(self) -> None:
        lock = self._owner._enter(self._key)
        try:
            await lock.acquire()
        except BaseException:
            self._owner._leave(self._key)
            raise
        self._lock = lock

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lock = self._lock
        assert lock is not None
        try:
            self._owner._release(self._key)
        finally:
            lock.release()
            self._owner._leave(self._key)
