"""Instruction admission at the Safe Step Boundary, and the baseline a request carries.

Before each physical attempt that reaches the model, :meth:`Instructions.prepare`
observes every source concurrently, exactly once (the built-ins in memory,
the files in one blocking call, the API entries in one read, alongside the
projected state), hashes each encoded value, diffs against the projected
current values and, when something changed, appends one
``session.instructions.updated`` whose command also stores the new blobs.
The drain calls it before input is promoted.

- No state yet (a new session, or after a committed revert): the delta is
  complete and has no text. Any unavailable source blocks it with
  :class:`InstructionsUnavailableError`; input stays pending.
- Otherwise: an unavailable source keeps its stored value; each changed key
  renders once (change, addition or removal), and the text is frozen in the
  event, which projects it as a chronological ``system`` message.

The request's system text is the epoch baseline rendered from the stored
*initial* values (cached by those values, bounded in bytes).
"""

from __future__ import annotations

import asyncio
import datetime
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

import attrs
import orjson

from actors.agents import Agent
from actors.instructions._render import (
    render_baseline,
    render_change,
    render_removal,
    sort_keys,
)
from actors.instructions._sources import (
    FileCache,
    FileSpec,
    Observation,
    builtin_values,
    entry_values,
    observe_files,
)
from actors.instructions._values import HashCache, encode
from actors.instructions._watch import ObservationCache
from protocol import events as ev
from protocol.lru import ByteLRU
from protocol.shapes import Session
from storage import Command, Store
from storage.queries import InstructionInputs, InstructionState

__all__ = ["BASELINE_CACHE_BYTES", "Guidance", "Instructions", "InstructionsUnavailableError"]

#: MCP guidance for a Location: ``{"mcp/<server>": instructions}`` (``actors.mcp``).
Guidance = Callable[[str], Awaitable[Mapping[str, str]]]
#: The namespace of MCP guidance keys (``actors.mcp.GUIDANCE_PREFIX``).
GUIDANCE_PREFIX: Final = "mcp/"

#: Threads observing instruction files at once (each job is one session's step).
OBSERVE_THREADS: Final = 2
#: Rendered baselines kept, by their initial values; least recently used evicted.
BASELINE_CACHE_BYTES: Final = 8 * 1024 * 1024
#: Sessions whose last admission found nothing to admit, remembered with what it
#: compared (by count, oldest first out; an entry holds references, no copies).
SETTLED_SESSIONS: Final = 1024


@attrs.frozen(eq=False)
class _Settled:
    """What a session's admission last compared when it admitted nothing: the
    same sources and the same stored state again admit nothing again."""

    builtin: tuple[str, str, str]
    files: tuple[Observation, ...]
    guidance: Mapping[str, str]
    entries: Sequence[tuple[str, str]]
    current: Mapping[str, str]
    initial: Mapping[str, str]
    text: str

    def holds(
        self,
        builtin: tuple[str, str, str],
        files: Sequence[Observation],
        entries: Sequence[tuple[str, str]],
        state: InstructionState,
        guidance: Mapping[str, str],
    ) -> bool:
        # The file observations are the cache's own objects while inotify
        # reports no change: compared by identity; the rest by value.
        return (
            builtin == self.builtin
            and len(files) == len(self.files)
            and all(a is b for a, b in zip(files, self.files, strict=True))
            and entries == self.entries
            and guidance == self.guidance
            and state.current == self.current
            and state.initial == self.initial
        )


class InstructionsUnavailableError(Exception):
    """A source could not be read when the session's first baseline was due."""

    type: Final = "instructions.unavailable"


def _today() -> str:
    return datetime.date.today().isoformat()  # host-local, day granularity


class Instructions:
    def __init__(
        self,
        *,
        store: Store,
        data_dir: Path,
        discover_project: bool = True,
        platform: str = sys.platform,
        today: Callable[[], str] | None = None,
        baseline_cache_bytes: int = BASELINE_CACHE_BYTES,
        guidance: Guidance | None = None,
    ) -> None:
        self._store = store
        #: MCP guidance: each server's instructions for a Location (``mcp/<server>``).
        self._guidance = guidance
        # File observation is short blocking I/O (stats, and reads of changed
        # files): a plain bounded executor of its own, one hop per step, not a
        # tool thread. :meth:`close` ends its threads.
        self._executor = ThreadPoolExecutor(
            max_workers=OBSERVE_THREADS, thread_name_prefix="sessionrt-instructions"
        )
        self._data_dir = str(data_dir)
        self._discover_project = discover_project
        self._platform = platform
        #: The date source; None reads the host-local date (looked up at each
        #: call, so a test can pin it).
        self._today = today
        self.files = FileCache()
        #: Observations served again while inotify reports no change (Linux).
        self.observations = ObservationCache()
        self.hashes = HashCache()
        self._baselines: ByteLRU[str, str] = ByteLRU(baseline_cache_bytes)
        self._settled: dict[str, _Settled] = {}

    async def prepare(
        self, session: Session, agent: Agent, inputs: InstructionInputs | None = None
    ) -> tuple[str, ...]:
        """Admit what changed; return the request's system text (the epoch baseline).

        ``inputs`` is the session's instruction state and entries when the
        caller has just read them (the drain does, at its boundary, with the
        inbox); otherwise they are read here, alongside the file observation.
        """
        spec = FileSpec(
            directory=session.location.directory,
            data_dir=self._data_dir,
            discover_project=self._discover_project,
            references=agent.references,
            skills=agent.skills,
        )
        if inputs is None:
            # A task group, not gather: when one side fails, the other is
            # cancelled and awaited instead of left running with no owner;
            # the caller still sees the failure itself, not a group of one.
            try:
                async with asyncio.TaskGroup() as group:
                    observing = group.create_task(self._observe(spec))
                    reading = group.create_task(self._store.queries.instruction_inputs(session.id))
                    guiding = group.create_task(self._mcp_guidance(spec.directory))
            except BaseExceptionGroup as failed:
                raise failed.exceptions[0] from None
            files, (state, entries) = observing.result(), reading.result()
            guidance = guiding.result()
        else:
            state, entries = inputs
            if self._guidance is None:
                files, guidance = await self._observe(spec), {}
            else:
                files, guidance = await asyncio.gather(
                    self._observe(spec), self._mcp_guidance(spec.directory)
                )
        date = (self._today or _today)()
        builtin = (agent.system, session.location.directory, date)
        settled = self._settled.get(session.id)
        if (
            state is not None
            and settled is not None
            and settled.holds(builtin, files, entries, state, guidance)
        ):
            # Nothing moved since the last step found nothing to admit (the
            # usual step): the same answer without hashing every value again.
            return (settled.text,)
        observations = [
            Observation(
                scope="builtin/",
                values=builtin_values(
                    system=agent.system,
                    directory=session.location.directory,
                    platform=self._platform,
                    date=date,
                ),
            ),
            *files,
            Observation(scope=GUIDANCE_PREFIX, values=guidance),
            Observation(
                scope="api/", values=entry_values([(k, orjson.loads(v)) for k, v in entries])
            ),
        ]
        current: Mapping[str, str] = {} if state is None else state.current
        delta: dict[str, str] = {}
        blobs: dict[str, str] = {}
        changed: dict[str, Any] = {}
        blocked: list[str] = []
        for obs in observations:
            blocked.extend(obs.unavailable.values())
            if obs.scope in obs.unavailable:
                continue  # the whole source keeps its stored values
            for key, value in obs.values.items():
                encoded = encode(value)
                digest = self.hashes.digest(encoded)
                if current.get(key) != digest:
                    delta[key] = digest
                    blobs[digest] = encoded.decode()
                    changed[key] = value
            for key in current:
                if obs.covers(key) and key not in obs.values and key not in obs.unavailable:
                    delta[key] = ev.REMOVED
        if state is None:
            if blocked:
                raise InstructionsUnavailableError(
                    "Instructions unavailable: " + "; ".join(blocked)
                )
            await self._store.append(
                Command.of(ev.InstructionsUpdated(session_id=session.id, delta=delta), blobs=blobs)
            )
            text = render_baseline(changed)
            key = _cache_key(delta)
            self._baselines.put(key, text, len(text) + len(key))
            return (text,)
        if delta:
            parts = [
                render_removal(k)
                if delta[k] == ev.REMOVED
                else render_change(k, changed[k], new=k not in current)
                for k in sort_keys(delta)
            ]
            await self._store.append(
                Command.of(
                    ev.InstructionsUpdated(
                        session_id=session.id, delta=delta, text="\n\n".join(parts)
                    ),
                    blobs=blobs,
                )
            )
            self._settled.pop(session.id, None)
            return (await self.baseline(state),)
        text = await self.baseline(state)
        # Out first, so that putting it back makes it the newest (oldest go first).
        self._settled.pop(session.id, None)
        if len(self._settled) >= SETTLED_SESSIONS:
            del self._settled[next(iter(self._settled))]
        self._settled[session.id] = _Settled(
            builtin=builtin,
            files=tuple(files),
            guidance=guidance,
            entries=entries,
            current=state.current,
            initial=state.initial,
            text=text,
        )
        return (text,)

    async def current(self, session: Session, agent: Agent) -> tuple[str, ...]:
        """The epoch baseline as stored now (after a compaction moved it); reads no source."""
        state = await self._store.queries.instruction_state(session.id)
        return () if state is None else (await self.baseline(state),)

    async def _mcp_guidance(self, directory: str) -> Mapping[str, str]:
        return {} if self._guidance is None else await self._guidance(directory)

    async def _observe(self, spec: FileSpec) -> list[Observation]:
        """The file sources now: the last observation while the kernel reports no
        change to what it read (no thread hop), else observed in the executor."""
        cached = self.observations.lookup(spec)
        if cached is not None:
            return cached
        begun = self.observations.begin()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._observe_now, spec, begun)

    def _observe_now(self, spec: FileSpec, begun: tuple[int, int]) -> list[Observation]:
        files = observe_files(spec, self.files)
        self.observations.store(spec, begun, files)
        return files

    def open(self) -> None:
        """Start watching the observed files (before, every step observes them afresh)."""
        self.observations.open()

    def close(self) -> None:
        """End the observation threads (after the last drain: jobs are milliseconds)."""
        self._executor.shutdown(wait=True, cancel_futures=True)
        self.observations.close()

    async def baseline(self, state: InstructionState) -> str:
        """The epoch baseline: the stored initial values, rendered."""
        key = _cache_key(state.initial)
        cached = self._baselines.get(key)
        if cached is not None:
            return cached
        blobs = await self._store.queries.instruction_blobs(list(state.initial.values()))
        values = {k: orjson.loads(blobs[h]) for k, h in state.initial.items() if h in blobs}
        text = render_baseline(values)
        self._baselines.put(key, text, len(text) + len(key))
        return text


def _cache_key(values: Mapping[str, str]) -> str:
    return orjson.dumps(dict(values), option=orjson.OPT_SORT_KEYS).decode()
