"""Nearby ``AGENTS.md``: injected after a successful read, once per session per file.

Ambient discovery (``discovery/agents``) covers the ``AGENTS.md`` files from
the project root down to the session's directory. A subdirectory may have its
own, which matters only once the model works there: after a successful
``read`` of a file (or ``list`` of a directory) below the session's
directory, every ``AGENTS.md`` from the target's directory up toward the
Location root (the Location's own excluded: discovery has it) is recorded as
a durable synthetic instruction message (``session.synthetic`` with
``metadata = {"notice": "instructions", "path": …}``), nearest to the root
first, right after the call's terminal and before the step's.

Once per session per file: the paths already injected are read from the
session's messages (so a restart does not inject again), and the calls of
one step are serialised, so two reads in the same directory inject its file
once. A file read directly is not injected (the model has just seen it); an
unreadable or empty one is skipped. The walk is a few ``stat`` calls on a
blocking-helper thread, with texts cached by their stat signature
(:class:`~actors.instructions._sources.FileCache`, bounded).
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import attrs

from actors.instructions._sources import FileCache, Unreadable
from protocol import events as ev
from protocol import ids
from storage import SessionReads

__all__ = [
    "NEARBY_NOTICE",
    "NEARBY_TOOLS",
    "Found",
    "Nearby",
    "NearbyInstructions",
    "nearby_files",
]

#: ``metadata.notice`` of an injected message.
NEARBY_NOTICE: Final = "instructions"
#: The tools whose success injects: what each reads (a file or a directory).
NEARBY_TOOLS: Final[Mapping[str, str]] = {"read": "file", "list": "directory"}
_NAME: Final = "AGENTS.md"


@attrs.frozen
class Found:
    #: Absolute (symlinks resolved): the once-per-session identity.
    path: str
    #: Relative to the Location, as the model is told.
    shown: str
    text: str


#: Runs a blocking callable off the loop.
Blocking = Callable[[Callable[[], Any]], Awaitable[Any]]
#: Records one event durably (the step's journal).
Durable = Callable[[ev.Event], Awaitable[None]]


def nearby_files(location: str, tool: str, path: str, cache: FileCache) -> list[Found]:
    """Blocking: the ``AGENTS.md`` files between the read target and the
    Location (the Location's own excluded), root side first."""
    kind = NEARBY_TOOLS.get(tool)
    if kind is None:
        return []
    root = os.path.realpath(location)
    try:
        target = os.path.realpath(os.path.join(root, path))
    except ValueError:  # a NUL byte
        return []
    if target == root or os.path.commonpath((root, target)) != root:
        return []
    current = target if kind == "directory" else os.path.dirname(target)
    dirs: list[str] = []
    while current != root and os.path.commonpath((root, current)) == root:
        dirs.append(current)
        current = os.path.dirname(current)
    found: list[Found] = []
    for directory in reversed(dirs):
        name = os.path.join(directory, _NAME)
        if name == target:
            continue
        try:
            text = cache.read(name)
        except Unreadable:
            continue
        if text and text.strip():
            found.append(Found(path=name, shown=os.path.relpath(name, root), text=text))
    return found


class NearbyInstructions:
    """The runtime's nearby-``AGENTS.md`` injection (one per runtime)."""

    def __init__(self, reads: SessionReads, blocking: Blocking, *, enabled: bool = True) -> None:
        self._reads = reads
        self._blocking = blocking
        self.enabled = enabled
        self.files = FileCache(max_entries=256, max_bytes=4 * 1024 * 1024)

    def for_step(self, session_id: str, location: str, durable: Durable) -> Nearby | None:
        """The injection of one step's calls (None when it is switched off)."""
        if not self.enabled:
            return None
        return Nearby(self, session_id, location, durable)

    async def injected(self, session_id: str) -> set[str]:
        return set(await self._reads.injected_instructions(session_id))

    async def found(self, location: str, tool: str, path: str) -> list[Found]:
        found: list[Found] = await self._blocking(
            functools.partial(nearby_files, location, tool, path, self.files)
        )
        return found


class Nearby:
    """One step's injection: its calls one at a time, each file once."""

    def __init__(
        self, owner: NearbyInstructions, session_id: str, location: str, durable: Durable
    ) -> None:
        self._owner = owner
        self._session_id = session_id
        self._location = location
        self._durable = durable
        self._lock = asyncio.Lock()

    async def after_success(self, tool: str, input: Mapping[str, Any]) -> None:
        """After ``tool`` succeeded with ``input``: inject what is near its target."""
        if tool not in NEARBY_TOOLS:
            return
        path = input.get("path", ".")
        if not isinstance(path, str):
            return
        found = await self._owner.found(self._location, tool, path)
        if not found:
            return
        async with self._lock:
            done = await self._owner.injected(self._session_id)
            for file in found:
                if file.path in done:
                    continue
                shown, text = file.shown, file.text
                await self._durable(
                    ev.SyntheticRecorded(
                        session_id=self._session_id,
                        message_id=ids.message_id(),
                        text=f"Instructions from {shown}:\n\n{text}",
                        description=f"Instructions from {shown}",
                        metadata={"notice": NEARBY_NOTICE, "path": file.path},
                    )
                )
