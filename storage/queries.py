"""Reads of the projections: sessions, transcript messages, pending inbox.

Everything here is a query over projected rows turned into public shapes;
nothing writes. ``fetch`` runs one statement on a read-only connection.
"""

from __future__ import annotations

import gc
import sys
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, Final, TypeAlias

import attrs
import orjson

from protocol import codec
from protocol import events as ev
from protocol.cursor import (
    Direction,
    MessageAnchor,
    MessageCursor,
    SessionAnchor,
    SessionCursor,
    SessionQuery,
    encode_cursor,
)
from protocol.lru import ByteLRU
from protocol.shapes import (
    AssistantMessage,
    CacheTokens,
    CompactionMessage,
    FileAttachment,
    ForkBoundary,
    InboxItem,
    Location,
    MessageTime,
    ModelRef,
    Order,
    Page,
    PageCursor,
    RetryState,
    Session,
    SessionMessage,
    SessionRevert,
    SessionTime,
    ShellInfo,
    ShellMessage,
    SyntheticMessage,
    SystemMessage,
    Tokens,
    UserMessage,
)
from protocol.untrack import untrack, untrack_dict, untrack_known, untracked_tuple
from storage.lease import Lease
from storage.schema import SESSION_BUCKET_MS

__all__ = [
    "Boundary",
    "Claim",
    "DrainStart",
    "Fetch",
    "FetchMany",
    "InstructionInputs",
    "InstructionState",
    "OpenToolCall",
    "Queries",
    "Row",
    "ToolProcess",
]

Row = Sequence[Any]


@attrs.frozen(kw_only=True)
class Claim:
    session_id: str
    parent_id: str | None
    time_claimed: int
    resume_attempts: int
    #: Who runs (or ran) it; None when no host ever took a lease on it.
    lease: Lease | None = None

    def orphaned(self, now: int) -> bool:
        """Claimed with no live lease: nobody runs it, any host may take it."""
        return self.lease is None or not self.lease.live(now)


@attrs.frozen(kw_only=True)
class OpenToolCall:
    assistant_message_id: str
    id: str
    name: str
    status: str


@attrs.frozen(kw_only=True)
class ToolProcess:
    """The recorded process group of a tool call that has no terminal yet."""

    session_id: str
    assistant_message_id: str
    call_id: str
    name: str
    pgid: int
    start_ticks: int
    boot_id: str


@attrs.frozen(kw_only=True)
class RunningShell:
    """A user shell entry still ``running``, with its process group once recorded."""

    session_id: str
    shell: ShellInfo
    #: ``(pgid, start_ticks, boot_id)`` from ``session.shell.spawned``; None before it.
    process: tuple[int, int, str] | None = None


Fetch = Callable[[str, Sequence[Any]], Awaitable[list[Row]]]
#: Several statements in one snapshot (one reader hop on SQLite, one connection on
#: PostgreSQL): their rows.
FetchMany = Callable[[Sequence[tuple[str, Sequence[Any]]]], Awaitable[list[list[Row]]]]


@attrs.frozen(kw_only=True)
class DrainStart:
    """What a drain reads before its first step, read together in one snapshot.

    A drain used to make six reads before it knew there was nothing stale to
    settle; under 100 concurrent sessions each read's hand-off cost more
    than its statement.
    """

    session: Session | None
    tool_processes: list[ToolProcess]
    open_tool_calls: list[OpenToolCall]
    open_step: str | None
    running_compaction: CompactionMessage | None
    inbox: list[InboxItem]
    #: :meth:`Queries.instruction_inputs`, from the same snapshot.
    instructions: InstructionInputs


@attrs.frozen
class Boundary:
    """What a drain reads at a Safe Step Boundary, in one snapshot: the pending
    input and the instruction inputs the next step's admission compares with.

    Under 100 concurrent sessions each reader round trip cost more than its
    statements; the two reads a step made here apart now go together.
    """

    inbox: list[InboxItem]
    instructions: InstructionInputs


_SESSION_COLUMNS: Final = (
    "id, parent_id, title, agent, model, directory, metadata, cost, tokens_input,"
    " tokens_output, tokens_reasoning, tokens_cache_read, tokens_cache_write,"
    " time_created, time_updated, retry, revert, fork_session_id, fork_boundary, time_idle,"
    " time_viewed"
)
# Rows a staged revert hides: its boundary message and everything after it.
_VISIBLE: Final = (
    "NOT EXISTS (SELECT 1 FROM session rs JOIN session_message rb"
    " ON rb.id = json_extract(rs.revert, '$.messageID') AND rb.session_id = rs.id"
    " WHERE rs.id = session_message.session_id AND session_message.seq >= rb.seq)"
)
_MESSAGE_COLUMNS: Final = "id, session_id, type, seq, time_created, time_updated, data"
# Messages with their parts in one statement (one reader round trip): the parts'
# stored JSON, in position order, as one JSON array; NULL for non-assistants.
_WITH_PARTS: Final = (
    f"SELECT {_MESSAGE_COLUMNS}, CASE WHEN type = 'assistant' THEN"
    " (SELECT json_group_array(json(data)) FROM"
    " (SELECT data FROM session_part WHERE message_id = session_message.id ORDER BY position)"
    " AS p)"
    " END FROM session_message"
)
_INBOX_COLUMNS: Final = "id, session_id, type, payload, delivery, time_created"
# A session still being imported (schema v16) is read as no session at all.
_SHOWN: Final = "importing IS NULL"
_SESSION_BY_ID: Final = f"SELECT {_SESSION_COLUMNS} FROM session WHERE id = ? AND {_SHOWN}"
_CONTEXT: Final = (
    f"{_WITH_PARTS} WHERE session_id = ? AND {_VISIBLE} AND seq >= coalesce((SELECT"
    " max(seq) FROM session_message WHERE session_id = ? AND type = 'compaction'"
    f" AND json_extract(data, '$.status') = 'completed' AND {_VISIBLE}), 0)"
    " ORDER BY seq"
)
_INBOX: Final = (
    f"SELECT {_INBOX_COLUMNS} FROM session_inbox WHERE session_id = ? ORDER BY enqueued_seq"
)
_OPEN_TOOL_CALLS: Final = (
    "SELECT message_id, data FROM session_part"
    " WHERE session_id = ? AND status IN ('streaming', 'running') ORDER BY position"
)
_TOOL_PROCESSES: Final = (
    "SELECT p.session_id, p.message_id, p.call_id,"
    " coalesce(json_extract(t.data, '$.name'), ''), p.pgid, p.start_ticks, p.boot_id"
    " FROM tool_process p LEFT JOIN session_part t"
    " ON t.message_id = p.message_id AND t.key = 'tool:' || p.call_id"
    " {where} ORDER BY p.session_id, p.message_id, p.call_id"
)
_ONE_SESSION: Final = "WHERE p.session_id = ?"
_RUNNING_COMPACTION: Final = (
    f"SELECT {_MESSAGE_COLUMNS} FROM session_message WHERE session_id = ?"
    " AND type = 'compaction' AND json_extract(data, '$.status') = 'running'"
    " ORDER BY seq DESC LIMIT 1"
)
_OPEN_STEP: Final = (
    "SELECT id, json_extract(data, '$.finish') IS NULL"
    " AND json_extract(data, '$.error') IS NULL AS unfinished FROM session_message"
    " WHERE session_id = ? AND type = 'assistant' ORDER BY seq DESC LIMIT 1"
)
# The session row, and whether anything a crash or restart can leave open is
# open: a process group, a streaming or running tool part, a running
# compaction, a newest assistant message with no terminal (the four reads of
# DrainStart, as one yes or no, made of those reads themselves). Nearly
# always no: one statement instead of five.
_SESSION_STALE: Final = (
    f"SELECT {_SESSION_COLUMNS},"
    f" EXISTS ({_TOOL_PROCESSES.format(where=_ONE_SESSION)})"
    f" OR EXISTS ({_OPEN_TOOL_CALLS})"
    f" OR EXISTS ({_RUNNING_COMPACTION})"
    f" OR coalesce((SELECT s.unfinished FROM ({_OPEN_STEP}) AS s), FALSE)"
    f" FROM session WHERE id = ? AND {_SHOWN}"
)
#: Bytes of decoded messages kept, least recently used evicted first (values are
#: immutable). An entry weighs its stored text: the decoded value holds about as much.
DECODE_CACHE_BYTES: Final = 32 * 1024 * 1024
#: Bytes of sessions' histories kept (:class:`HistoryCache`), least recently used
#: session evicted first; a session weighs the stored text of its rows. A history
#: heavier than the whole bound is kept alone (every other one goes) until the next
#: session's is kept: its next step needs it whole anyway, and dropping it made
#: every step a full read, with the stored text and its decoded copy held at once.
HISTORY_CACHE_BYTES: Final = 64 * 1024 * 1024

# The state a history read checks its cached rows against, in the read's own
# snapshot: the newest position (every later change is marked above it) and
# how many times rows have left the session's transcript (``removals``: a
# committed revert deletes rows, which no change marker can show).
_HISTORY_STATE: Final = "(SELECT coalesce(max(position), 0) FROM event), removals"
#: The session row with that state after its columns (no row: no session).
_SESSION_HISTORY_STATE: Final = (
    f"SELECT {_SESSION_COLUMNS}, {_HISTORY_STATE} FROM session WHERE id = ? AND {_SHOWN}"
)
# A session's messages written after a position, or whose parts were. The
# second branch is driven by the parts' index and finds its messages by id
# (``changed + 0`` keeps SQLite from scanning the session's messages by the
# marker index instead); a part's session is its message's.
_HISTORY_CHANGED: Final = (
    f"{_WITH_PARTS} WHERE session_id = ? AND changed > ?"
    f" UNION ALL {_WITH_PARTS} WHERE id IN"
    " (SELECT message_id FROM session_part WHERE session_id = ? AND changed > ?)"
    " AND changed + 0 <= ?"
)


#: Hashes per blob read statement (reference §4.11).
_BLOB_BATCH: Final = 500


def _taken(rows: list[Row]) -> Iterator[Row]:
    """Each of ``rows`` in turn, let go of by the list as it is handed out.

    A full read of a long transcript fetches all of its stored text at once;
    decoding it row by row while the list kept every row held the stored text
    and its decoded copy both whole (twice the transcript, at the peak).
    """
    for i in range(len(rows)):
        row = rows[i]
        rows[i] = ()
        yield row


@attrs.frozen(kw_only=True)
class InstructionState:
    """A session's projected instruction values, ``{key: sha256hex}``."""

    epoch_start: int
    through_seq: int
    initial: Mapping[str, str]
    current: Mapping[str, str]


#: A session's instruction state (None before its first baseline) and its live
#: API entries ``(key, canonical JSON)``, sorted by key.
InstructionInputs: TypeAlias = tuple[InstructionState | None, list[tuple[str, str]]]


@attrs.frozen
class _History:
    """One session's message rows as of ``marker`` (a log position), in seq order.

    Never changed once built: a read derives a new one from it and the rows
    changed since, so two reads of one session racing each other cannot mix
    their snapshots.
    """

    marker: int
    order: tuple[SessionMessage, ...]
    seqs: tuple[int, ...]
    by_id: Mapping[str, SessionMessage]
    #: id -> the message's weight in bytes (apart from ``by_id``: a dict of atoms
    #: only, which the cyclic collector does not track, where a ``(message,
    #: weight)`` tuple per message was one more object for every full pass)
    sizes: Mapping[str, int]
    #: Seqs of completed compactions (the candidates for the active boundary).
    completed: frozenset[int]
    #: The session's ``removals`` when these rows were read: another count means
    #: rows have gone since, and the next read is a full one.
    removals: int
    weight: int

    def active(self, revert: SessionRevert | None) -> list[SessionMessage]:
        """The active history: visible rows from the last visible completed compaction on.

        The same rows as the full read (``_CONTEXT``): a staged revert hides
        its boundary message and everything after it.
        """
        end = len(self.order)
        hidden = None if revert is None else self.by_id.get(revert.message_id)
        if hidden is not None:
            end = bisect_left(self.seqs, hidden.seq)
        limit = self.seqs[end] if end < len(self.seqs) else None
        boundary = max((s for s in self.completed if limit is None or s < limit), default=None)
        start = 0 if boundary is None else bisect_left(self.seqs, boundary)
        return list(self.order[start:end])


class HistoryCache:
    """Sessions' message rows by session, bounded by bytes (:data:`HISTORY_CACHE_BYTES`).

    A step used to re-read and re-decode its session's whole history: the cost
    of a turn grew with the session. Each read now fetches only the rows
    written (``changed``) after the position its cached copy was read at, and
    checks the session's ``removals`` in its own snapshot: a committed revert
    (the one projection that deletes transcript rows but the session's own
    deletion) counts one more, and the read starts over from a full one. The
    check costs the same at 4,000 messages as at 10 (counting the rows, as it
    did, grew with them). Visibility (a staged revert) and the compaction
    boundary are worked out from the session row of the same snapshot.
    """

    def __init__(self, max_bytes: int = HISTORY_CACHE_BYTES) -> None:
        self._entries: ByteLRU[str, _History] = ByteLRU(max_bytes, oversized="alone")

    @property
    def bytes(self) -> int:
        return self._entries.bytes

    @property
    def max_bytes(self) -> int:
        return self._entries.max_bytes

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, session_id: str) -> _History | None:
        return self._entries.get(session_id)

    def keep(self, session_id: str, history: _History) -> None:
        """Keep ``history`` unless a read of a newer snapshot got there first."""
        current = self._entries.get(session_id)
        if current is None or current.marker < history.marker:
            self._entries.put(session_id, history, history.weight)

    def forget(self, session_id: str) -> None:
        self._entries.discard(session_id)


class Queries:
    def __init__(
        self,
        fetch: Fetch,
        *,
        cache_bytes: int = DECODE_CACHE_BYTES,
        fetch_many: FetchMany | None = None,
        history_bytes: int = HISTORY_CACHE_BYTES,
    ) -> None:
        self._fetch = fetch
        self._fetch_many = fetch_many or self._fetch_each
        self.histories = HistoryCache(history_bytes)
        # Decoded messages by id, and beside them the fingerprint of the stored
        # text each was decoded from: two containers, so that an entry is no
        # ``(fingerprint, message)`` tuple of its own for the collector to walk
        # (the fingerprints are tuples of atoms, which it stops tracking).
        # Fingerprints of evicted messages are let go in bulk (:meth:`_keep`).
        self._cache: ByteLRU[str, SessionMessage] = ByteLRU(cache_bytes)
        self._prints: dict[str, tuple[Any, ...]] = {}

    @property
    def cache(self) -> ByteLRU[str, SessionMessage]:
        """The decode cache (its ``bytes`` and ``max_bytes`` are what tests and tools read)."""
        return self._cache

    async def _fetch_each(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[list[Row]]:
        return [await self._fetch(sql, params) for sql, params in statements]

    # -- sessions -------------------------------------------------------------------------------

    async def session(self, session_id: str) -> Session | None:
        rows = await self._fetch(_SESSION_BY_ID, (session_id,))
        return _session(rows[0]) if rows else None

    async def children(self, session_id: str) -> list[str]:
        rows = await self._fetch("SELECT id FROM session WHERE parent_id = ?", (session_id,))
        return [str(r[0]) for r in rows]

    async def child_sessions(self, session_id: str, limit: int) -> list[Session]:
        """The session's children, oldest first, at most ``limit``."""
        rows = await self._fetch(
            f"SELECT {_SESSION_COLUMNS} FROM session WHERE parent_id = ?"
            " ORDER BY time_created, id LIMIT ?",
            (session_id, limit),
        )
        return [_session(r) for r in rows]

    async def sessions(self, query: SessionQuery, anchor: SessionAnchor | None) -> Page[Session]:
        """One page of sessions ordered by (time_updated, id), continuing from ``anchor``."""
        where: list[str] = [_SHOWN]
        params: list[Any] = []
        if query.search:
            where.append("title LIKE ? ESCAPE '\\'")
            params.append(f"%{_escape_like(query.search)}%")
        if query.roots:
            where.append("parent_id IS NULL")
        elif query.parent_id is not None:
            where.append("parent_id = ?")
            params.append(query.parent_id)
        if anchor is not None:
            # The bucket's bound is implied by the exact one; it lets the
            # index (on the bucket first: schema v14) start at the anchor.
            cmp = _cmp(query.order, anchor.direction)
            where.append(f"time_bucket {cmp}= ? AND (time_updated, id) {cmp} (?, ?)")
            params += [anchor.time // SESSION_BUCKET_MS, anchor.time, anchor.id]
        rows, more = await self._page(
            f"SELECT {_SESSION_COLUMNS} FROM session",
            where,
            params,
            "time_bucket {dir}, time_updated {dir}, id {dir}",
            query.order,
            None if anchor is None else anchor.direction,
            query.limit,
        )
        items = [_session(r) for r in rows]

        def link(s: Session, direction: Direction) -> str:
            anchor = SessionAnchor(id=s.id, time=s.time.updated, direction=direction)
            return encode_cursor(_with_anchor(query, anchor))

        return Page(data=tuple(items), cursor=_links(items, more, anchor, link))

    # -- messages -------------------------------------------------------------------------------

    async def messages(
        self, session_id: str, order: Order, limit: int, anchor: MessageAnchor | None
    ) -> Page[SessionMessage]:
        """One page of a session's transcript ordered by seq, continuing from ``anchor``."""
        where = ["session_id = ?", _VISIBLE]
        params: list[Any] = [session_id]
        if anchor is not None:
            where.append(f"seq {_cmp(order, anchor.direction)} ?")
            params.append(anchor.seq)
        rows, more = await self._page(
            _WITH_PARTS,
            where,
            params,
            "seq {dir}",
            order,
            None if anchor is None else anchor.direction,
            limit,
        )
        items = [self._decoded(r) for r in rows]

        def link(m: SessionMessage, direction: Direction) -> str:
            a = MessageAnchor(id=m.id, seq=m.seq, direction=direction)
            return encode_cursor(
                MessageCursor(session_id=session_id, order=order, limit=limit, anchor=a)
            )

        return Page(data=tuple(items), cursor=_links(items, more, anchor, link))

    async def message(self, session_id: str, message_id: str) -> SessionMessage | None:
        rows = await self._fetch(
            f"{_WITH_PARTS} WHERE id = ? AND session_id = ?",
            (message_id, session_id),
        )
        return self._decoded(rows[0]) if rows else None

    async def context(self, session_id: str) -> list[SessionMessage]:
        """The active history: from the last completed compaction on (all without one)."""
        return (await self.step_inputs(session_id))[1]

    async def full_context(self, session_id: str) -> list[SessionMessage]:
        """:meth:`context` read in full, past the history cache (what it must equal)."""
        rows = await self._fetch(_CONTEXT, (session_id, session_id))
        return [self._decoded(r) for r in _taken(rows)]

    async def step_inputs(self, session_id: str) -> tuple[Session | None, list[SessionMessage]]:
        """:meth:`session` and :meth:`context` read together, in one snapshot.

        The history comes from :attr:`histories` brought up to date with the
        rows changed since it was read; a removal seen in the snapshot costs
        one more round trip, a full read.
        """
        base = self.histories.get(session_id)
        session, history = await self._read_history(session_id, base)
        if session is not None and history is None:
            session, history = await self._read_history(session_id, None)
        if session is None:
            self.histories.forget(session_id)
            return None, []
        assert history is not None  # a full read always adds up
        self.histories.keep(session_id, history)
        return session, history.active(session.revert)

    async def _read_history(
        self, session_id: str, base: _History | None
    ) -> tuple[Session | None, _History | None]:
        """The session and its rows from ``base`` on; None rows when they do not add up
        (and when there is no session)."""
        marker = -1 if base is None else base.marker
        session_rows, rows = await self._fetch_many(
            [
                (_SESSION_HISTORY_STATE, (session_id,)),
                (_HISTORY_CHANGED, (session_id, marker, session_id, marker, marker)),
            ]
        )
        if not session_rows:
            return None, None
        row = session_rows[0]
        session = _session(row)
        position, removals = int(row[-2]), int(row[-1])
        if base is not None and base.removals != removals:
            return session, None  # rows were removed since ``base``: read in full
        history = self._merged(session_id, base, rows, position, removals)
        return session, history

    def _merged(
        self,
        session_id: str,
        base: _History | None,
        rows: list[Row],
        marker: int,
        removals: int,
    ) -> _History:
        by_id: dict[str, SessionMessage] = {} if base is None else dict(base.by_id)
        sizes: dict[str, int] = {} if base is None else dict(base.sizes)
        order = [] if base is None else list(base.order)
        seqs = [] if base is None else list(base.seqs)
        completed = set() if base is None else set(base.completed)
        weight = 0 if base is None else base.weight
        resort = False
        # Whether every message in by_id is untracked (a decoded message is, once
        # the decode cache holds it; one too heavy for that cache is not).
        untracked = base is None or not gc.is_tracked(base.by_id)
        for row in _taken(rows):
            if row[1] != session_id:
                continue  # never, by construction (a part's session is its message's)
            message = self._decoded(row)
            untracked = untrack(message) and untracked
            size = sys.getsizeof(row[6]) + (0 if row[7] is None else sys.getsizeof(row[7]))
            old = by_id.get(message.id)
            by_id[message.id] = message
            weight += size - sizes.get(message.id, 0)
            sizes[message.id] = size
            if old is not None:
                completed.discard(old.seq)
                i = bisect_left(seqs, old.seq)
                if old.seq == message.seq and i < len(seqs) and seqs[i] == message.seq:
                    order[i] = message
                else:
                    resort = True
            elif not seqs or message.seq > seqs[-1]:
                order.append(message)
                seqs.append(message.seq)
            else:
                resort = True
            if isinstance(message, CompactionMessage) and message.status == "completed":
                completed.add(message.seq)
        if resort:
            order = sorted(by_id.values(), key=_seq)
            seqs = [m.seq for m in order]
        order_t, seqs_t, completed_t = tuple(order), untracked_tuple(seqs), frozenset(completed)
        untrack_known(completed_t)  # ints
        if untracked:
            # Never changed once built, and all it holds is out of the collector's
            # reach: so are the dict and the tuple (a full pass walked every message
            # of every cached history), and then the _History with them
            # (HistoryCache.keep), without a walk of each message at every step.
            untrack_dict(by_id)
            untrack_known(order_t)
        return _History(
            marker=marker,
            order=order_t,
            seqs=seqs_t,
            by_id=by_id,
            sizes=sizes,
            completed=completed_t,
            removals=removals,
            weight=weight,
        )

    def _decoded(self, row: Row) -> SessionMessage:
        # Steps reload the whole history; decoding it again each time was the
        # cost that grew with the session. An entry is valid only for the exact
        # stored text it was decoded from (the row and its parts), so a changed
        # row is never served stale; the fingerprint holds lengths and hashes
        # of that text, not the text itself, which would double what is kept.
        data, parts_text = row[6], row[7]
        fingerprint = (
            row[3],
            row[5],
            len(data),
            hash(data),
            parts_text and len(parts_text),
            parts_text and hash(parts_text),
        )
        cached = self._cache.get(row[0])
        if cached is not None and self._prints.get(row[0]) == fingerprint:
            return cached
        parts = [] if parts_text is None else orjson.loads(parts_text)
        message = message_from_row(row, parts)
        weight = sys.getsizeof(data) + (0 if parts_text is None else sys.getsizeof(parts_text))
        self._keep(row[0], fingerprint, message, weight)
        return message

    def _keep(
        self, message_id: str, fingerprint: tuple[Any, ...], message: SessionMessage, weight: int
    ) -> None:
        self._cache.put(message_id, message, weight)
        # Untracked before it is stored, a tuple of atoms leaves the dict untracked
        # too (storing a tracked one tracked it: a full pass walked every entry).
        untrack(fingerprint)
        self._prints[message_id] = fingerprint
        # Bounded by the cache's own count: past twice that (plus some), the
        # fingerprints of evicted messages go, at a cost spread over the puts.
        if len(self._prints) > 2 * len(self._cache) + 64:
            cache = self._cache
            self._prints = {k: v for k, v in self._prints.items() if k in cache}

    async def newest_message(self, session_id: str) -> str | None:
        rows = await self._fetch(
            f"SELECT id FROM session_message WHERE session_id = ? AND {_VISIBLE}"
            " ORDER BY seq DESC LIMIT 1",
            (session_id,),
        )
        return str(rows[0][0]) if rows else None

    # -- statistics -----------------------------------------------------------------------------

    async def session_count(self) -> tuple[int, int]:
        """(sessions, of which forks)."""
        rows = await self._fetch(
            f"SELECT count(*), count(fork_session_id) FROM session WHERE {_SHOWN}", ()
        )
        return int(rows[0][0]), int(rows[0][1])

    async def usage_by_model(self) -> list[Row]:
        """Per model of assistant messages: model JSON, sessions, messages, cost, tokens.

        Copied fork history (seq <= 0) is left out: its usage was spent, and
        counted, in the session it was copied from.
        """
        return await self._fetch(
            "SELECT json_extract(data, '$.model'), count(DISTINCT session_id), count(*),"
            " total(json_extract(data, '$.cost')),"
            " total(json_extract(data, '$.tokens.input')),"
            " total(json_extract(data, '$.tokens.output')),"
            " total(json_extract(data, '$.tokens.reasoning')),"
            " total(json_extract(data, '$.tokens.cache.read')),"
            " total(json_extract(data, '$.tokens.cache.write'))"
            " FROM session_message WHERE type = 'assistant' AND seq > 0"
            " GROUP BY 1 ORDER BY 1",
            (),
        )

    async def message_seq(self, session_id: str, message_id: str) -> int | None:
        """The transcript position of a message, hidden or not; None if absent."""
        rows = await self._fetch(
            "SELECT seq FROM session_message WHERE id = ? AND session_id = ?",
            (message_id, session_id),
        )
        return int(rows[0][0]) if rows else None

    async def held_synthetic(self, session_id: str) -> list[str]:
        """Pending synthetic input admitted since the session's revert was staged."""
        rows = await self._fetch(
            "SELECT id FROM session_inbox WHERE session_id = ? AND type = 'synthetic'"
            " AND enqueued_seq > (SELECT MAX(seq) FROM event WHERE aggregate_id = ?"
            " AND type = 'session.revert.staged.1') ORDER BY enqueued_seq",
            (session_id, session_id),
        )
        return [str(r[0]) for r in rows]

    async def was_cancelled(self, session_id: str, inbox_id: str) -> bool:
        """Whether ``inbox_id`` was cancelled in ``session_id`` and not admitted since.

        Read only when a cancel finds the item not pending (a second cancel):
        it walks the session's cancellations, not a hot path.
        """
        rows = await self._fetch(
            "SELECT type FROM event WHERE aggregate_id = ?"
            " AND type IN ('session.inbox.cancelled.1', 'session.inbox.enqueued.1')"
            " AND json_extract(data, '$.inboxID') = ? ORDER BY seq DESC LIMIT 1",
            (session_id, inbox_id),
        )
        return bool(rows) and str(rows[0][0]) == "session.inbox.cancelled.1"

    # -- shells and snapshots -------------------------------------------------------------------

    async def running_shells(self) -> list[RunningShell]:
        """Every shell entry still ``running``, by session and log order."""
        rows = await self._fetch(
            "SELECT session_id, json_extract(data, '$.shell'), json_extract(data, '$.process')"
            " FROM session_message"
            " WHERE type = 'shell' AND json_extract(data, '$.shell.state') = 'running'"
            " ORDER BY session_id, seq",
            (),
        )
        out = []
        for r in rows:
            p = None if r[2] is None else orjson.loads(r[2])
            out.append(
                RunningShell(
                    session_id=str(r[0]),
                    shell=codec.from_json(ShellInfo, orjson.loads(r[1])),
                    process=None if p is None else (p["pgid"], p["startTicks"], p["bootID"]),
                )
            )
        return out

    async def step_snapshots(
        self, session_id: str, from_seq: int = 0
    ) -> list[tuple[int, str, str, tuple[str, ...]]]:
        """The file snapshots of writing steps from ``from_seq`` on, in log order.

        Each row is (seq, before, after, files) of a ``step.ended`` or
        ``step.failed``: ``before`` holds each of ``files`` as it was before
        the step. (A log written before snapshots became lazy has the tree
        before each step on its ``step.started``: that is its ``before``.)
        """
        rows = await self._fetch(
            "SELECT seq, type, json_extract(data, '$.before'), json_extract(data, '$.snapshot'),"
            " json_extract(data, '$.files')"
            " FROM event WHERE aggregate_id = ? AND seq >= ?"
            " AND type IN ('session.step.started.1', 'session.step.ended.1',"
            " 'session.step.failed.1')"
            " AND json_extract(data, '$.snapshot') IS NOT NULL ORDER BY seq",
            (session_id, from_seq),
        )
        out: list[tuple[int, str, str, tuple[str, ...]]] = []
        started: str | None = None
        for seq, type_, before, after, files in rows:
            if type_ == "session.step.started.1":
                started = str(after)
                continue
            first = before if before is not None else started
            started = None
            if first is not None:
                out.append(
                    (int(seq), str(first), str(after), tuple(orjson.loads(files)) if files else ())
                )
        return out

    async def step_snapshot(
        self, session_id: str, message_id: str, seq: int
    ) -> tuple[str, str, tuple[str, ...]] | None:
        """(before, after, files) of the step of assistant message ``message_id``.

        ``seq`` is the message's transcript position: the seq of its step's
        first ``step.started``. None when that step recorded no snapshot (it
        ran no writing tool, its directory is not in a git work tree, it has
        not ended yet) or the message is no step of this session's log (copied
        by a fork, imported). The step's events are the first step events
        from ``seq`` on: a later physical attempt of the step (after a crash)
        starts again under the same message id before any other step starts.
        """
        if seq <= 0:
            return None
        rows = await self._fetch(
            "SELECT type, json_extract(data, '$.assistantMessageID'),"
            " json_extract(data, '$.before'), json_extract(data, '$.snapshot'),"
            " json_extract(data, '$.files')"
            " FROM event WHERE aggregate_id = ? AND seq >= ?"
            " AND type IN ('session.step.started.1', 'session.step.ended.1',"
            " 'session.step.failed.1') ORDER BY seq LIMIT 16",
            (session_id, seq),
        )
        before: str | None = None
        after: str | None = None
        started: str | None = None
        files: set[str] = set()
        for type_, owner, first, snapshot, changed in rows:
            if owner != message_id:
                break  # the next step: this one's events are all read
            if type_ == "session.step.started.1":
                started = None if snapshot is None else str(snapshot)
                continue
            if snapshot is None:
                continue
            base = first if first is not None else started
            if base is None:
                continue
            before = str(base) if before is None else before
            after = str(snapshot)
            files.update(orjson.loads(changed) if changed else ())
        if before is None or after is None:
            return None
        return before, after, tuple(sorted(files))

    # -- execution ------------------------------------------------------------------------------

    async def imports(self) -> list[tuple[str, int]]:
        """Sessions still being imported (hidden: schema v16), each with its log's head seq."""
        rows = await self._fetch(
            "SELECT id, (SELECT coalesce(max(seq), 0) FROM event WHERE aggregate_id = session.id)"
            " FROM session WHERE importing IS NOT NULL ORDER BY id",
            (),
        )
        return [(str(r[0]), int(r[1])) for r in rows]

    async def claims(self, session_id: str | None = None) -> list[Claim]:
        """Sessions holding a write-ahead execution claim: all, or one session's."""
        one = "" if session_id is None else " AND s.id = ?"
        rows = await self._fetch(
            "SELECT s.id, s.parent_id, s.time_claimed, s.resume_attempts,"
            " l.host_id, l.epoch, l.expires FROM session s"
            " LEFT JOIN session_lease l ON l.session_id = s.id"
            f" WHERE s.time_claimed IS NOT NULL{one} ORDER BY s.time_claimed, s.id",
            () if session_id is None else (session_id,),
        )
        return [
            Claim(
                session_id=r[0],
                parent_id=r[1],
                time_claimed=r[2],
                resume_attempts=r[3],
                lease=None
                if r[4] is None
                else Lease(session_id=r[0], host_id=r[4], epoch=r[5], expires=r[6]),
            )
            for r in rows
        ]

    async def leases(self, *, live_at: int | None = None) -> list[Lease]:
        """Every session's lease row (only those live at ``live_at`` ms, when given)."""
        rows = await self._fetch(
            "SELECT session_id, host_id, epoch, expires FROM session_lease"
            " WHERE expires > ? ORDER BY session_id",
            (-1 if live_at is None else live_at,),
        )
        return [Lease(session_id=r[0], host_id=r[1], epoch=r[2], expires=r[3]) for r in rows]

    async def open_tool_calls(self, session_id: str) -> list[OpenToolCall]:
        """Tool parts still streaming or running (stale after a crash or restart)."""
        return _open_tool_calls(await self._fetch(_OPEN_TOOL_CALLS, (session_id,)))

    async def tool_processes(self, session_id: str | None = None) -> list[ToolProcess]:
        """Process groups of tool calls without a terminal: all, or one session's."""
        if session_id:
            rows = await self._fetch(_TOOL_PROCESSES.format(where=_ONE_SESSION), (session_id,))
        else:
            rows = await self._fetch(_TOOL_PROCESSES.format(where=""), ())
        return _tool_processes(rows)

    async def running_compaction(self, session_id: str) -> CompactionMessage | None:
        """The session's compaction still ``running`` (a crash or restart cut it off)."""
        return _running_compaction(await self._fetch(_RUNNING_COMPACTION, (session_id,)))

    async def drain_start(self, session_id: str) -> DrainStart:
        """The session, what a crash or restart left open in it, its pending input
        and its instruction inputs.

        One snapshot says whether anything is left open; only then a second
        one reads what (every part again, so the parts agree).
        """
        one = (session_id,)
        session, inbox, instructions = await self._fetch_many(
            [
                (_SESSION_STALE, (session_id,) * 5),
                (_INBOX, one),
                (_INSTRUCTION_INPUTS, (session_id, session_id)),
            ]
        )
        if not session or not session[0][-1]:
            return DrainStart(
                session=_session(session[0]) if session else None,
                tool_processes=[],
                open_tool_calls=[],
                open_step=None,
                running_compaction=None,
                inbox=[_inbox_item(r) for r in inbox],
                instructions=_instruction_inputs(instructions),
            )
        session, processes, calls, step, compaction, inbox, instructions = await self._fetch_many(
            [
                (_SESSION_BY_ID, one),
                (_TOOL_PROCESSES.format(where=_ONE_SESSION), one),
                (_OPEN_TOOL_CALLS, one),
                (_OPEN_STEP, one),
                (_RUNNING_COMPACTION, one),
                (_INBOX, one),
                (_INSTRUCTION_INPUTS, (session_id, session_id)),
            ]
        )
        return DrainStart(
            session=_session(session[0]) if session else None,
            tool_processes=_tool_processes(processes),
            open_tool_calls=_open_tool_calls(calls),
            open_step=_open_step(step),
            running_compaction=_running_compaction(compaction),
            inbox=[_inbox_item(r) for r in inbox],
            instructions=_instruction_inputs(instructions),
        )

    async def permission_requests(self, session_id: str) -> list[ev.PermissionAsked]:
        """The session's unanswered permission requests, oldest first (at most 1,000)."""
        rows = await self._fetch(
            "SELECT data FROM session_permission WHERE session_id = ? AND status = 'pending'"
            " ORDER BY asked_seq LIMIT 1000",
            (session_id,),
        )
        return [codec.from_json(ev.PermissionAsked, orjson.loads(r[0])) for r in rows]

    async def permission_status(self, session_id: str, permission_id: str) -> str | None:
        """``pending``, a reply, or ``expired``; None for an id this session never asked."""
        rows = await self._fetch(
            "SELECT status FROM session_permission WHERE session_id = ? AND id = ?",
            (session_id, permission_id),
        )
        return str(rows[0][0]) if rows else None

    async def permission_rules(self, session_id: str) -> list[tuple[str, str]]:
        """``(permission, pattern)`` the session allowed with ``always`` replies, in order."""
        rows = await self._fetch(
            "SELECT permission, j.value FROM session_permission, json_each(data, '$.always') j"
            " WHERE session_id = ? AND status = 'always' ORDER BY asked_seq, j.key LIMIT 10000",
            (session_id,),
        )
        return [(str(r[0]), str(r[1])) for r in rows]

    async def injected_instructions(self, session_id: str) -> list[str]:
        """Paths of the nearby ``AGENTS.md`` files the session was given (once each)."""
        rows = await self._fetch(
            "SELECT json_extract(data, '$.payload.metadata.path') FROM session_message"
            " WHERE session_id = ? AND type = 'synthetic'"
            " AND json_extract(data, '$.payload.metadata.notice') = 'instructions'",
            (session_id,),
        )
        return [str(r[0]) for r in rows if r[0] is not None]

    async def open_step(self, session_id: str) -> str | None:
        """The newest assistant message when its step has no terminal (cut off by a crash).

        Only the newest can be open: a step settles before the next one starts.
        """
        return _open_step(await self._fetch(_OPEN_STEP, (session_id,)))

    # -- inbox ----------------------------------------------------------------------------------

    async def inbox(self, session_id: str) -> list[InboxItem]:
        rows = await self._fetch(_INBOX, (session_id,))
        return [_inbox_item(r) for r in rows]

    async def boundary(self, session_id: str) -> Boundary:
        """The pending input and the instruction inputs, in one round trip."""
        inbox, instructions = await self._fetch_many(
            [(_INBOX, (session_id,)), (_INSTRUCTION_INPUTS, (session_id, session_id))]
        )
        return Boundary(
            inbox=[_inbox_item(r) for r in inbox], instructions=_instruction_inputs(instructions)
        )

    async def admission(self, item_id: str) -> InboxItem | None:
        """The admission receipt of ``item_id``, pending or delivered, in any session."""
        rows = await self._fetch(
            # Both branches give the same column types (PostgreSQL checks them).
            f"SELECT {_INBOX_COLUMNS}, NULL, 0 FROM session_inbox WHERE id = ?"
            " UNION ALL SELECT id, session_id, type, NULL, NULL, time_created, data, 1"
            " FROM session_message WHERE id = ?",
            (item_id, item_id),
        )
        if not rows:
            return None
        row = rows[0]
        return _inbox_item(row) if row[-1] == 0 else _receipt_from_message(row)

    # -- instructions ---------------------------------------------------------------------------

    async def instruction_state(self, session_id: str) -> InstructionState | None:
        rows = await self._fetch(
            "SELECT epoch_start, through_seq, initial_values, current_values"
            " FROM instruction_state WHERE session_id = ?",
            (session_id,),
        )
        return _instruction_state(rows[0]) if rows else None

    async def instruction_inputs(self, session_id: str) -> InstructionInputs:
        """:meth:`instruction_state` and :meth:`instruction_entries` in one statement."""
        return _instruction_inputs(await self._fetch(_INSTRUCTION_INPUTS, (session_id, session_id)))

    async def instruction_blobs(self, hashes: Sequence[str]) -> dict[str, str]:
        """The stored canonical JSON of each known hash, read 500 per statement."""
        out: dict[str, str] = {}
        unique = sorted(set(hashes))
        for start in range(0, len(unique), _BLOB_BATCH):
            batch = unique[start : start + _BLOB_BATCH]
            marks = ", ".join("?" * len(batch))
            rows = await self._fetch(
                f"SELECT hash, value FROM instruction_blob WHERE hash IN ({marks})", batch
            )
            out.update((str(r[0]), str(r[1])) for r in rows)
        return out

    async def instruction_entries(self, session_id: str) -> list[tuple[str, str]]:
        """Live (not removed) entries as (key, canonical JSON text), by key."""
        rows = await self._fetch(
            "SELECT key, value FROM instruction_entry WHERE session_id = ? AND removed = 0"
            " ORDER BY key",
            (session_id,),
        )
        return [(str(r[0]), str(r[1])) for r in rows]

    # -- helpers --------------------------------------------------------------------------------

    async def _page(
        self,
        select: str,
        where: list[str],
        params: list[Any],
        order_by: str,
        order: Order,
        direction: Direction | None,
        limit: int,
    ) -> tuple[list[Row], bool]:
        # Walking backwards reads in the opposite order and flips the rows back.
        backwards = direction == "previous"
        sql_order = ("DESC" if order == "asc" else "ASC") if backwards else order.upper()
        sql = select
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY " + order_by.format(dir=sql_order) + " LIMIT ?"
        rows = await self._fetch(sql, (*params, limit + 1))
        more = len(rows) > limit
        rows = rows[:limit]
        if backwards:
            rows.reverse()
        return rows, more


def _cmp(order: Order, direction: Direction) -> str:
    forward = direction == "next"
    return ">" if (order == "asc") == forward else "<"


def _links(
    items: Sequence[Any],
    more: bool,
    anchor: Any,
    link: Callable[[Any, Direction], str],
) -> PageCursor:
    if not items:
        return PageCursor()
    direction = None if anchor is None else anchor.direction
    has_next = more if direction != "previous" else True
    has_previous = more if direction == "previous" else direction == "next"
    return PageCursor(
        previous=link(items[0], "previous") if has_previous else None,
        next=link(items[-1], "next") if has_next else None,
    )


def _with_anchor(query: SessionQuery, anchor: SessionAnchor) -> SessionCursor:
    return SessionCursor(query=query, anchor=anchor)


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _loads(text: str | None) -> Any:
    return None if text is None else orjson.loads(text)


def _session(r: Row) -> Session:
    model = _loads(r[4])
    return Session(
        id=r[0],
        parent_id=r[1],
        title=r[2],
        agent=r[3],
        model=None if model is None else codec.from_json(ModelRef, model),
        location=Location(directory=r[5]),
        metadata=_loads(r[6]),
        cost=float(r[7]),
        tokens=Tokens(
            input=r[8], output=r[9], reasoning=r[10], cache=CacheTokens(read=r[11], write=r[12])
        ),
        time=SessionTime(created=r[13], updated=r[14], idle=r[19], viewed=r[20]),
        retry=None if r[15] is None else codec.from_json(RetryState, orjson.loads(r[15])),
        revert=None if r[16] is None else codec.from_json(SessionRevert, orjson.loads(r[16])),
        fork_session_id=r[17],
        fork_boundary=None if r[18] is None else codec.from_json(ForkBoundary, orjson.loads(r[18])),
    )


def _seq(message: SessionMessage) -> int:
    return message.seq


def _open_tool_calls(rows: Sequence[Row]) -> list[OpenToolCall]:
    calls = []
    for message_id, data in rows:
        part = orjson.loads(data)
        calls.append(
            OpenToolCall(
                assistant_message_id=message_id,
                id=part["id"],
                name=part.get("name", ""),
                status=part["status"],
            )
        )
    return calls


def _tool_processes(rows: Sequence[Row]) -> list[ToolProcess]:
    return [
        ToolProcess(
            session_id=r[0],
            assistant_message_id=r[1],
            call_id=r[2],
            name=r[3],
            pgid=r[4],
            start_ticks=r[5],
            boot_id=r[6],
        )
        for r in rows
    ]


def _running_compaction(rows: Sequence[Row]) -> CompactionMessage | None:
    if not rows:
        return None
    message = message_from_row(rows[0])
    assert isinstance(message, CompactionMessage)
    return message


def _open_step(rows: Sequence[Row]) -> str | None:
    return str(rows[0][0]) if rows and rows[0][1] else None


_INSTRUCTION_INPUTS: Final = (
    "SELECT 0, NULL, NULL, epoch_start, through_seq, initial_values, current_values"
    " FROM instruction_state WHERE session_id = ?"
    " UNION ALL SELECT 1, key, value, NULL, NULL, NULL, NULL FROM instruction_entry"
    " WHERE session_id = ? AND removed = 0"
)


def _instruction_state(r: Row) -> InstructionState:
    """From ``epoch_start, through_seq, initial_values, current_values``."""
    return InstructionState(
        epoch_start=int(r[0]),
        through_seq=int(r[1]),
        initial=orjson.loads(r[2]),
        current=orjson.loads(r[3]),
    )


def _instruction_inputs(rows: Sequence[Row]) -> InstructionInputs:
    state = None
    entries: list[tuple[str, str]] = []
    for r in rows:
        if r[0] == 0:
            state = _instruction_state(r[3:])
        else:
            entries.append((str(r[1]), str(r[2])))
    entries.sort()
    return state, entries


def _inbox_item(r: Row) -> InboxItem:
    return InboxItem(
        id=r[0],
        session_id=r[1],
        type=r[2],
        payload=orjson.loads(r[3]),
        delivery=r[4],
        time_created=r[5],
    )


def _receipt_from_message(r: Row) -> InboxItem:
    # Columns: id, session_id, type, -, -, time_created, data, flag.
    data: Mapping[str, Any] = orjson.loads(r[6])
    return InboxItem(
        id=r[0],
        session_id=r[1],
        type=r[2],
        payload=data.get("payload", {}),
        delivery=data.get("delivery", "steer"),
        time_created=int(data.get("timeCreated", r[5])),
    )


def message_from_row(r: Row, parts: Sequence[Any] = ()) -> SessionMessage:
    """Columns: id, session_id, type, seq, time_created, time_updated, data."""
    data: Mapping[str, Any] = orjson.loads(r[6])
    if r[2] == "assistant":
        return codec.from_json(
            AssistantMessage,
            {
                **data,
                "type": "assistant",
                "id": r[0],
                "sessionID": r[1],
                "seq": r[3],
                "time": {"created": r[4], "updated": r[5]},
                "parts": list(parts),
            },
        )
    payload: Mapping[str, Any] = data.get("payload", {})
    time = MessageTime(created=r[4], updated=r[5])
    if r[2] == "user":
        files = payload.get("files")
        return UserMessage(
            id=r[0],
            session_id=r[1],
            seq=r[3],
            time=time,
            text=payload.get("text", ""),
            files=None if files is None else codec.from_json(tuple[FileAttachment, ...], files),
            metadata=payload.get("metadata"),
        )
    if r[2] == "system":
        keys = data.get("keys")
        return SystemMessage(
            id=r[0],
            session_id=r[1],
            seq=r[3],
            time=time,
            text=data["text"],
            keys=None if keys is None else tuple(keys),
        )
    if r[2] == "synthetic":
        return SyntheticMessage(
            id=r[0],
            session_id=r[1],
            seq=r[3],
            time=time,
            text=payload.get("text", ""),
            description=payload.get("description"),
            metadata=payload.get("metadata"),
        )
    if r[2] == "shell":
        return ShellMessage(
            id=r[0],
            session_id=r[1],
            seq=r[3],
            time=time,
            shell=codec.from_json(ShellInfo, data["shell"]),
            output=data.get("output"),
        )
    if r[2] == "compaction":
        return CompactionMessage(
            id=r[0],
            session_id=r[1],
            seq=r[3],
            time=time,
            status=data["status"],
            reason=data["reason"],
            text=data.get("text"),
            recent=data.get("recent"),
            error=data.get("error"),
            input_id=data.get("inputID"),
        )
    raise ValueError(f"unknown message type {r[2]!r}")
