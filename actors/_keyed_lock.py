"""A mutex per key (session id) that forgets keys nobody holds or waits for."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
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

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                try:
                    yield
                finally:
                    self._release(key)
        finally:
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
