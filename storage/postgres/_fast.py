"""The optimistic path of a PostgreSQL batch: the whole batch in one round trip.

The savepoint path in :mod:`._writer` pays one network round trip per
statement (a SAVEPOINT per command, its insert, each projector op, the
release): tens per batch, each a scheduling of the server process, which on
a loaded machine costs milliseconds. Nearly every batch commits whole, so
this path bets on that. Here, in Python: the seqs, from the heads this store
remembers (:class:`Heads`; read once for an aggregate it does not know), the
records and their projector ops. Then one statement, in its own implicit
transaction, calls a server-side function (:data:`_HEAD`) that

1. takes the batch lock (:data:`~._writer.LOG_LOCK`), then, in statements
   that see every batch committed before it, checks each remembered head
   and makes each command's lease use in command order (``take``: the row
   expired or this host's, epoch up by one; ``hold``, ``renew``,
   ``release``: that host, that epoch, not expired), as
   :func:`storage._pg_lease.use_lease` does;
2. allocates the positions (under the lock: they follow commit order),
   inserts the events, runs every op in order (projections, instruction
   blobs and entries) and raises when one touches other than its ``expect``
   rows; records the fences; NOTIFYs with the positions filled in, if
   another origin listens (:mod:`.listeners`);
3. returns the positions and each lease use's epoch, once committed (a
   take's records get theirs from it).

Anything this path does not handle exactly as the savepoint path would makes
it step aside before it writes (:class:`Fallback`): a seq mismatch (a
conflict or an exact replay), a guard, an op statement or parameter type
outside what :class:`Plans` holds, a string holding U+0000. Anything that
fails while it runs (a moved head, a lease held elsewhere or not held, a
constraint, an ``expect`` count, a projector's bug, data
the server refuses) rolls the whole batch back, and the caller redoes it on
the savepoint path, which isolates the failing command with its usual error.
The outcomes are therefore the savepoint path's; only the positions a rolled
back attempt took are skipped (positions may have gaps anyway).

Positions exist only inside the function, yet projectors write them (the
``changed`` marker on transcript rows). Python projects each record with a
:class:`_PositionRef` as its position; a parameter that is one travels as a
reference (argument index, record index) and the function fills in the
allocated position before running the ops. That relies on projectors passing
the position through untouched, never computing with it (a test holds them
to it), and never reading the ``event`` table (they read nothing: see
:mod:`storage.projectors`).

No value is ever spliced into SQL text. Each op's statement keeps its
placeholders; its parameters travel as one ``text[]`` (bound, not quoted)
and each placeholder reads its element cast to the type the server inferred
for it when the statement was prepared (:class:`Plans`); a Python value
becomes that type's text form (:func:`_as_text`) only for the few types
whose text form is exact. The batch's arrays are bound packed, each as one
text (:func:`_packed`, :func:`_joined`) that the function splits back: asyncpg
binds a ``text`` for the cost of a copy but checks each element of an array
against ABCs, which cost half the client's time per call.

The function lives in ``pg_temp``, created on each writer connection: it is
always this build's, whatever build another host runs on the same database,
and it needs no schema migration.
"""

from __future__ import annotations

import collections
import re
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

import asyncpg
import attrs

from storage._ops import Op
from storage._replay import mismatched
from storage.batch import Outcome, Prepared
from storage.lease import LeaseUse
from storage.postgres.dialect import translate, translate_cast
from storage.postgres.listeners import others_listen
from storage.postgres.notify import parts
from storage.projectors import project
from storage.recorder import Command, RecordedEvent

__all__ = [
    "MAX_HEADS",
    "MAX_PLANS",
    "MAX_STATEMENTS",
    "Fallback",
    "Heads",
    "Plans",
    "commit_fast",
    "ints_from",
]

#: Distinct op statements the function holds; past that, a new one takes the savepoint path.
MAX_PLANS: Final = 1024
#: Distinct op statements remembered (held or refused); past that, not looked at.
MAX_STATEMENTS: Final = 4096
#: SQLSTATE the function raises when an op touched other than its ``expect`` rows.
EXPECT_FAILED: Final = "SRX01"
#: SQLSTATE the function raises when an aggregate's head is not the one the batch assumed.
HEAD_MOVED: Final = "SRX02"
#: SQLSTATE the function raises when a command's lease use is refused (held
#: elsewhere for a take, not held for the others).
LEASE_NOT_HELD: Final = "SRX03"
#: Aggregates whose head the store remembers between batches (least recently used out).
MAX_HEADS: Final = 16384

#: Parameter types whose text form round-trips exactly, by the Python values they take.
_KINDS: Final = {
    "text": "text",
    "varchar": "text",
    "json": "text",
    "jsonb": "text",
    "int2": "int",
    "int4": "int",
    "int8": "int",
    "float4": "float",
    "float8": "float",
    "bool": "bool",
}
#: Statements the function may hold as they are: one DML statement, nothing that
#: could end it or the function body early (a ``;``, a dollar quote, a comment:
#: :data:`_UNSAFE`, :data:`_DOLLAR`).
_STATEMENT: Final = re.compile(r"\s*(INSERT|UPDATE|DELETE)\s", re.IGNORECASE)
_UNSAFE: Final = (";", "--", "/*")
#: A ``$`` that could open or close a dollar quote (``$$``, ``$tag$``, the
#: tag any identifier) or be a positional parameter (``$1``, in the body the
#: function's own): any ``$`` but a JSON path's (``'$.finish'``, ``'$[0]'``).
_DOLLAR: Final = re.compile(r"\$(?![.\[])")
#: A keyed UPDATE a run of ops may share (see :func:`_run_body`): one row by a
#: unique ``id``, its new values from its own columns and the parameters only.
_KEYED: Final = re.compile(r"UPDATE (?P<table>\w+) SET (?P<set>.+) WHERE id = \?")
#: Tables whose ``id`` is their primary key (``_KEYED`` statements on others run one by one).
_KEYED_TABLES: Final = frozenset({"session"})

#: The batch's arrays, as the function receives them (see :func:`_packed`):
#: text arrays in ``_srt_texts``, integer arrays in ``_srt_ints``, in these orders.
_TEXT_ARRAYS: Final = (
    "aggs",
    "ev_id",
    "ev_agg",
    "ev_type",
    "ev_data",
    "args",
    "bodies",
    "hold_session",
    "hold_host",
    "hold_kind",
)
_INT_ARRAYS: Final = (
    ("heads", "bigint"),
    ("ev_seq", "bigint"),
    ("ev_created", "bigint"),
    ("op", "bigint"),
    ("expect", "bigint"),
    ("off", "int"),
    ("run", "int"),
    ("hold_epoch", "bigint"),
    ("hold_ttl", "bigint"),
    ("fence_lease", "int"),
    ("ref_at", "int"),
    ("ref_rec", "int"),
)


def ints_from(text: str, kind: str) -> str:
    """SQL reading an integer array back from ``text``, an expression holding
    :func:`_joined`'s form: the array's own literal, braces aside (the array
    input parses it straight to ``kind``, at about half the cost of splitting
    it to text elements and casting each)."""
    return f"('{{' || {text} || '}}')::{kind}[]"


def texts_from(text: str) -> str:
    """SQL reading a text array back from ``text``, an expression holding
    :func:`_packed`'s form."""
    return f"string_to_array({text}, chr(31), chr(30))"


#: Their declarations, each read back from its text.
_ARRAYS: Final = "".join(
    f"    _srt_{name} text[] := {texts_from(f'_srt_texts[{i}]')};\n"
    for i, name in enumerate(_TEXT_ARRAYS, 1)
) + "".join(
    f"    _srt_{name} {kind}[] := {ints_from(f'_srt_ints[{i}]', kind)};\n"
    for i, (name, kind) in enumerate(_INT_ARRAYS, 1)
)

_HEAD: Final = (
    """
CREATE OR REPLACE FUNCTION pg_temp.sessionrt_apply(
    _srt_lock bigint, _srt_channel text, _srt_origin text, _srt_prefix text,
    _srt_texts text[], _srt_ints text[]
) RETURNS bigint[] LANGUAGE plpgsql VOLATILE AS $_srt_fn$
#variable_conflict use_column
DECLARE
{ARRAYS}    _srt_i int := 1;
    _srt_o int;
    _srt_len int;
    _srt_id bigint;
    _srt_n bigint;
    _srt_need bigint;
    _srt_hit bigint;
    _srt_bad bigint;
    _srt_pos bigint[];
    _srt_last bigint;
    _srt_now bigint;
    _srt_got bigint;
    _srt_lh text;
    _srt_le bigint;
    _srt_lx bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(_srt_lock);
    -- A new statement, so a new snapshot: every batch committed before the lock.
    -- Only aggregates the batch expects but appends nothing to: for the others
    -- the event insert itself finds a moved head (their next seq is taken, and
    -- UNIQUE (aggregate_id, seq) refuses it), with no read per aggregate.
    -- (Asked only when there are some: the query's start costs a batch more
    -- than the rest of this check.)
    IF cardinality(_srt_aggs) > 0 THEN
        IF EXISTS (
            SELECT 1 FROM unnest(_srt_aggs, _srt_heads) AS h(a, s)
            WHERE coalesce((SELECT max(seq) FROM event WHERE aggregate_id = h.a), 0) <> h.s
        ) THEN
            RAISE EXCEPTION 'a head moved' USING ERRCODE = '{HEAD_MOVED}';
        END IF;
    END IF;
    -- The commands' lease uses, in command order, by the rules of
    -- storage._pg_lease.use_lease: a take needs the row expired or this host's
    -- (the epoch goes up by one), any other use needs it live at that host and
    -- epoch. A refusal sends the batch to the savepoint path, which gives it to
    -- its command alone. Each use's epoch is left in _srt_hold_epoch.
    FOR _srt_k IN 1 .. coalesce(cardinality(_srt_hold_session), 0) LOOP
        _srt_now := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
        IF _srt_hold_kind[_srt_k] = 'take' THEN
            _srt_got := NULL;
            INSERT INTO session_lease (session_id, host_id, epoch, expires)
            VALUES (_srt_hold_session[_srt_k], _srt_hold_host[_srt_k], 1,
                    _srt_now + _srt_hold_ttl[_srt_k])
            ON CONFLICT (session_id) DO UPDATE SET host_id = excluded.host_id,
                epoch = session_lease.epoch + 1, expires = excluded.expires
            WHERE session_lease.expires <= _srt_now
               OR session_lease.host_id = excluded.host_id
            RETURNING epoch INTO _srt_got;
            IF _srt_got IS NULL THEN
                RAISE EXCEPTION 'a lease is held elsewhere' USING ERRCODE = '{LEASE_NOT_HELD}';
            END IF;
            _srt_hold_epoch[_srt_k] := _srt_got;
        ELSE
            SELECT host_id, epoch, expires INTO _srt_lh, _srt_le, _srt_lx
            FROM session_lease WHERE session_id = _srt_hold_session[_srt_k] FOR UPDATE;
            IF NOT FOUND OR _srt_lh <> _srt_hold_host[_srt_k]
               OR _srt_le <> _srt_hold_epoch[_srt_k] OR _srt_lx <= _srt_now THEN
                RAISE EXCEPTION 'a lease is not held' USING ERRCODE = '{LEASE_NOT_HELD}';
            END IF;
            IF _srt_hold_kind[_srt_k] = 'renew' THEN
                UPDATE session_lease SET expires = _srt_now + _srt_hold_ttl[_srt_k]
                WHERE session_id = _srt_hold_session[_srt_k];
            ELSIF _srt_hold_kind[_srt_k] = 'release' THEN
                UPDATE session_lease SET expires = 0
                WHERE session_id = _srt_hold_session[_srt_k];
            END IF;
        END IF;
    END LOOP;
    -- The batch's positions as one block, its last taken at once: every
    -- allocation of a position happens under the lock (this path's and the
    -- savepoint path's), so no other can land inside the block.
    _srt_len := coalesce(array_length(_srt_ev_id, 1), 0);
    IF _srt_len > 0 THEN
        _srt_last := setval('event_position', nextval('event_position') + _srt_len - 1);
        _srt_pos := ARRAY(SELECT generate_series(_srt_last - _srt_len + 1, _srt_last));
    END IF;
    INSERT INTO event (position, id, aggregate_id, seq, type, created, data)
    SELECT * FROM unnest(_srt_pos, _srt_ev_id, _srt_ev_agg, _srt_ev_seq, _srt_ev_type,
        _srt_ev_created, _srt_ev_data);
    -- Parameters that are a record's position get it now that it exists.
    FOR _srt_i IN 1 .. coalesce(array_length(_srt_ref_at, 1), 0) LOOP
        _srt_args[_srt_ref_at[_srt_i]] := _srt_pos[_srt_ref_rec[_srt_i]]::text;
    END LOOP;
    WHILE _srt_i <= coalesce(array_length(_srt_op, 1), 0) LOOP
        _srt_id := _srt_op[_srt_i];
        _srt_o := _srt_off[_srt_i];
        _srt_len := abs(_srt_run[_srt_i]);
        _srt_n := NULL;
        IF _srt_len > 1 THEN
            -- A run of one keyed UPDATE over distinct rows, as one statement:
            -- each op touched its row (expect 1) or none, and nothing else.
            IF _srt_run[_srt_i] < 0 THEN
                -- Every op expects its row (the length came negative): each
                -- touches at most its one, so the row count is the check.
{PLAINS}                _srt_hit := _srt_n;
                _srt_bad := 0;
                _srt_need := _srt_len;
            ELSE
{RUNS}            END IF;
            IF _srt_bad <> 0 OR _srt_hit <> _srt_need THEN
                RAISE EXCEPTION 'a run of op % touched other rows than expected', _srt_i
                    USING ERRCODE = '{EXPECT_FAILED}';
            END IF;
            _srt_i := _srt_i + _srt_len;
            CONTINUE;
        END IF;
""".replace("{HEAD_MOVED}", HEAD_MOVED)
    .replace("{LEASE_NOT_HELD}", LEASE_NOT_HELD)
    .replace("{EXPECT_FAILED}", EXPECT_FAILED)
    .replace("{ARRAYS}", _ARRAYS)
)
_TAIL: Final = f"""
        IF _srt_expect[_srt_i] IS NOT NULL AND _srt_n IS DISTINCT FROM _srt_expect[_srt_i] THEN
            RAISE EXCEPTION 'op % touched % rows, not %', _srt_i, _srt_n, _srt_expect[_srt_i]
                USING ERRCODE = '{EXPECT_FAILED}';
        END IF;
        _srt_i := _srt_i + 1;
    END LOOP;
    -- Notices only while another origin listens (see storage.postgres.listeners).
    IF _srt_pos IS NOT NULL
       AND {others_listen("_srt_origin")} THEN
        FOR _srt_i IN 1 .. coalesce(array_length(_srt_bodies, 1), 0) LOOP
            PERFORM pg_notify(_srt_channel, _srt_prefix || ' ' || _srt_pos[1] || ' '
                || _srt_pos[array_length(_srt_pos, 1)] || _srt_bodies[_srt_i]);
        END LOOP;
    END IF;
    IF _srt_hold_session IS NOT NULL THEN
        INSERT INTO event_fence (position, session_id, host_id, epoch)
        SELECT p, a, _srt_hold_host[l], _srt_hold_epoch[l]
        FROM unnest(_srt_pos, _srt_ev_agg, _srt_fence_lease) AS f(p, a, l)
        WHERE l > 0;
    END IF;
    -- The positions, then each lease use's epoch.
    RETURN coalesce(_srt_pos, '{{}}') || _srt_hold_epoch;
END
$_srt_fn$;
"""

_CALL: Final = "SELECT pg_temp.sessionrt_apply($1, $2, $3, $4, $5, $6)"
_HEADS: Final = (
    "SELECT a, coalesce((SELECT max(seq) FROM event WHERE aggregate_id = a), 0)"
    " FROM unnest($1::text[]) AS u(a)"
)


# The instruction rows a command writes besides its events, as ops (the
# savepoint path's statements, in placeholder form).
_INSERT_BLOB: Final = (
    "INSERT INTO instruction_blob (hash, value) VALUES (?, ?) ON CONFLICT (hash) DO NOTHING"
)
_UPSERT_ENTRY: Final = (
    "INSERT INTO instruction_entry (session_id, key, value, removed, time_created, time_updated)"
    " VALUES (?, ?, ?, 0, ?, ?)"
    " ON CONFLICT (session_id, key) DO UPDATE SET value = excluded.value, removed = 0,"
    " time_updated = excluded.time_updated"
    " WHERE instruction_entry.value IS DISTINCT FROM excluded.value"
    " OR instruction_entry.removed <> 0"
)
_REMOVE_ENTRY: Final = (
    "UPDATE instruction_entry SET value = NULL, removed = 1, time_updated = ?"
    " WHERE session_id = ? AND key = ? AND removed = 0"
)


class Fallback(Exception):
    """This batch is not for the fast path; nothing of it was written."""


@attrs.frozen
class Plan:
    """An op statement as the function holds it, and how its parameters become text."""

    id: int
    sql: str
    #: The statement with its n-th placeholder written ``(_srt_args[_srt_o + n])::type``.
    body: str
    kinds: tuple[str, ...]
    #: For a keyed UPDATE (its last parameter the row's id): the statement that
    #: runs a run of it over distinct rows at once, counting each op's rows;
    #: None for any other.
    run: str | None = None
    #: The same run when every op of it expects its row: the row count alone says so.
    plain: str | None = None


class Plans:
    """Per store: each op statement's plan (None: not for this path), and which
    version of the function each writer connection holds.

    The function runs every statement it knows as static SQL, so PL/pgSQL
    keeps a plan for each (a dynamic ``EXECUTE`` is planned anew every time,
    at about 2.5 times the cost). A statement seen for the first time is
    prepared once, for the types the server infers for its parameters, and
    the function is replaced (before the batch's statement) to hold it. A
    statement the server refuses to prepare, or a function it refuses to
    create with the new statements, leaves those statements to the savepoint
    path for good. Bounded: at most :data:`MAX_PLANS` statements held, and
    :data:`MAX_STATEMENTS` remembered.
    """

    def __init__(self) -> None:
        self._plans: dict[str, Plan | None] = {}
        self._held: list[Plan] = []
        #: Plans a function was created with (the server accepted them).
        self._compiled = 0
        self._installed: weakref.WeakKeyDictionary[asyncpg.Connection, int] = (
            weakref.WeakKeyDictionary()
        )

    def held(self, sql: str) -> Plan | None:
        """``sql``'s plan if the function already holds it, else None (ask :meth:`plan`).

        The per-op lookup of a batch without a coroutine per op: after a
        store's first batches nearly every statement is held.
        """
        return self._plans.get(sql)

    async def plan(self, conn: asyncpg.Connection, sql: str) -> Plan | None:
        try:
            return self._plans[sql]
        except KeyError:
            pass
        if len(self._plans) >= MAX_STATEMENTS:
            return None
        plan: Plan | None = None
        if (
            len(self._held) < MAX_PLANS
            and _STATEMENT.match(sql)
            and not any(mark in sql for mark in _UNSAFE)
            and _DOLLAR.search(sql) is None
        ):
            try:
                types = (await conn.prepare(translate(sql))).get_parameters()
            except asyncpg.PostgresError:
                types = None  # the savepoint path reports it, command by command
            if types is not None and all(
                t.schema == "pg_catalog" and t.name in _KINDS for t in types
            ):
                casts = tuple(f"pg_catalog.{t.name}" for t in types)
                plan = Plan(
                    id=len(self._held) + 1,
                    sql=sql,
                    body=translate_cast(sql, casts, "(_srt_args[_srt_o + {n}])::{type}"),
                    kinds=tuple(_KINDS[t.name] for t in types),
                    run=_run_body(sql, casts),
                    plain=_run_body(sql, casts, plain=True),
                )
                self._held.append(plan)
        self._plans[sql] = plan
        return plan

    async def install(self, conn: asyncpg.Connection) -> None:
        """Make ``conn``'s function hold every plan (outside any transaction)."""
        version = len(self._held)
        if self._installed.get(conn) == version:
            return
        try:
            runs = _dispatch([(p.id, p.run) for p in self._held if p.run is not None])
            plains = _dispatch([(p.id, p.plain) for p in self._held if p.plain is not None])
            await conn.execute(
                _HEAD.replace("{RUNS}", runs).replace("{PLAINS}", plains)
                + _dispatch([(p.id, p.body) for p in self._held])
                + _TAIL
            )
        except asyncpg.PostgresError:
            good = self._compiled
            for plan in self._held[good:]:
                self._plans[plan.sql] = None
            del self._held[good:]
            raise
        self._installed[conn] = version
        self._compiled = max(self._compiled, version)


class Heads:
    """The latest seq this store knows of each aggregate it wrote recently.

    Only a guess: another host may have written since (its notices move the
    guess forward, :meth:`saw`, but one may still be on its way). The function
    checks every guess under the batch lock and refuses the batch when one is
    off; the savepoint path then redoes it, reading the heads under the lock.
    Bounded: :data:`MAX_HEADS` aggregates, least recently used first out.
    """

    def __init__(self) -> None:
        self._seqs: collections.OrderedDict[str, int] = collections.OrderedDict()

    async def of(self, conn: asyncpg.Connection, aggregates: Sequence[str]) -> dict[str, int]:
        """The guesses for ``aggregates``. Their recency is left to what follows:
        :meth:`moved` once the batch commits, :meth:`forget` if it does not."""
        known = self._seqs
        out: dict[str, int] = {}
        missing = []
        for agg in aggregates:
            seq = known.get(agg)
            if seq is None:
                missing.append(agg)
            else:
                out[agg] = seq
        if missing:
            out.update((r[0], int(r[1])) for r in await conn.fetch(_HEADS, missing))
        return out

    def moved(self, seqs: dict[str, int]) -> None:
        for agg, seq in seqs.items():
            self._seqs[agg] = seq
            self._seqs.move_to_end(agg)
        while len(self._seqs) > MAX_HEADS:
            self._seqs.popitem(last=False)

    def forget(self, aggregates: Iterable[str]) -> None:
        for agg in aggregates:
            self._seqs.pop(agg, None)

    def saw(self, heads: Iterable[tuple[str, int]]) -> None:
        """Another host committed up to these seqs (its NOTIFY says so).

        Only aggregates already remembered move, and never back: a notice
        names committed seqs only, so each is a floor of the true head, and
        one may arrive after this store's own later commit. Without this, the
        next batch touching such an aggregate went the savepoint path whole.
        """
        known = self._seqs
        for agg, seq in heads:
            mine = known.get(agg)
            if mine is not None and seq > mine:
                known[agg] = seq


def _dispatch(bodies: Sequence[tuple[int, str]]) -> str:
    """A binary tree of IFs over ``(plan id, statement)`` in id order, each leaf the
    statement and its row count."""
    if not bodies:
        return ""
    if len(bodies) == 1:
        return f"{bodies[0][1]}\n;\nGET DIAGNOSTICS _srt_n = ROW_COUNT;\n"
    mid = len(bodies) // 2
    return (
        f"IF _srt_id <= {bodies[mid - 1][0]} THEN\n{_dispatch(bodies[:mid])}"
        f"ELSE\n{_dispatch(bodies[mid:])}END IF;\n"
    )


#: The rows of a run: each op's argument offset and ``expect``, from the batch's arrays.
_RUN_ROWS: Final = (
    " FROM unnest(_srt_off[_srt_i : _srt_i + _srt_len - 1],"
    " _srt_expect[_srt_i : _srt_i + _srt_len - 1]) AS _srt_u(_srt_uo, _srt_ue)"
)
#: ...and of a plain run, whose every ``expect`` is 1.
_PLAIN_ROWS: Final = " FROM unnest(_srt_off[_srt_i : _srt_i + _srt_len - 1]) AS _srt_u(_srt_uo)"


def _run_body(sql: str, casts: tuple[str, ...], *, plain: bool = False) -> str | None:
    """The set-based form of a keyed UPDATE, for a run of ops on distinct rows.

    ``UPDATE t SET … WHERE id = ?`` once per op costs a statement each; one
    ``UPDATE … FROM`` the run's rows does the same writes, because the ops
    touch distinct rows (the caller makes runs of distinct ids only) and each
    new value depends on its own row and the op's parameters alone (no
    subquery). Each touched row returns its op's ``expect``, so the run
    checks every op's count as the one-by-one form would. ``plain``: the
    bare UPDATE, for a run whose every op expects its row (the caller reads
    the row count). None for any other statement.
    """
    match = _KEYED.fullmatch(sql)
    if (
        match is None
        or match["table"] not in _KEYED_TABLES
        or "WHERE" in match["set"].upper()
        or "SELECT" in sql.upper()
        or not casts
    ):
        return None
    rows = _PLAIN_ROWS if plain else _RUN_ROWS
    keyed = f"UPDATE {match['table']} SET {match['set']}{rows} WHERE id = ?"
    update = translate_cast(keyed, casts, "(_srt_args[_srt_u._srt_uo + {n}])::{type}")
    if plain:
        return update
    return (
        f"WITH _srt_done AS ({update} RETURNING _srt_u._srt_ue)"
        " SELECT count(*) FILTER (WHERE _srt_ue = 1),"
        " count(*) FILTER (WHERE _srt_ue IS NOT NULL AND _srt_ue <> 1),"
        " (SELECT count(*) FILTER (WHERE _srt_e IS NOT NULL AND _srt_e <> 0)"
        " FROM unnest(_srt_expect[_srt_i : _srt_i + _srt_len - 1]) AS _srt_x(_srt_e))"
        " INTO _srt_hit, _srt_bad, _srt_need FROM _srt_done"
    )


#: Sets a field of a frozen record (see the end of :func:`commit_fast`).
_place: Final = object.__setattr__


class _PositionRef(int):
    """A record's position before it exists: the ``index``-th record of the batch (from 1).

    Its value is far outside any real position, so a projector that computed
    with it instead of passing it through would write something absurd, and
    the test that holds projectors to pass-through catches that.
    """

    index: int

    def __new__(cls, index: int) -> _PositionRef:
        ref = super().__new__(cls, -(1 << 62) - index)
        ref.index = index
        return ref


#: The references of a batch's first records, made once (each is immutable),
#: rather than an int subclass made per record.
_REFS: Final = tuple(_PositionRef(i) for i in range(2049))
_MADE_REFS: Final = len(_REFS)


#: Separates the elements of a packed text array; marks a NULL element (see :func:`_packed`).
_END: Final = "\x1f"
_NULL: Final = "\x1e"


def _packed(values: Sequence[str | None]) -> str:
    """A text array as one text: the elements joined by :data:`_END`, None as
    :data:`_NULL` (:func:`texts_from` reads it). One ``text`` binds at the
    cost of a copy, where asyncpg checks every element of a ``text[]``
    against two ABCs (a quarter of the client's work per batch).

    Raises Fallback when an element holds either mark, which would split it
    wrongly, and for a lone empty text, which splits to no element at all. A
    mark after every element would tell those two apart, but the server
    would then copy each array to drop its empty last element (about 5 µs
    for a 50-element one, ten arrays a batch), for a batch that hardly
    exists (one op with one parameter, and that an empty text: every other
    array holds ids, JSON and notices).
    """
    if not values:
        return ""
    try:
        packed = _END.join(values)  # type: ignore[arg-type]  # None: TypeError
        nulls = 0
    except TypeError:
        packed = _END.join([_NULL if v is None else v for v in values])
        nulls = values.count(None)
    if not packed:
        raise Fallback("a lone empty text")
    if packed.count(_END) != len(values) - 1 or packed.count(_NULL) != nulls:
        raise Fallback("a text holding U+001E or U+001F")
    return packed


def _joined(values: Sequence[int | None]) -> str:
    """An integer array as one text, ``NULL`` for None (:func:`ints_from` reads it)."""
    try:
        return ",".join(map(int.__repr__, values))  # a None: TypeError
    except TypeError:
        return ",".join(["NULL" if v is None else int.__repr__(v) for v in values])


def _as_text(kind: str, value: Any) -> str | None:
    """``value`` in the text form of a parameter of ``kind``; Fallback if not exact."""
    if value is None:
        return None
    if kind == "text":
        if isinstance(value, str) and "\x00" not in value:
            return str.__str__(value)
    elif isinstance(value, bool):
        if kind == "bool":
            return "true" if value else "false"
    elif kind == "int":
        if isinstance(value, int):
            return int.__repr__(value)
    elif kind == "float" and isinstance(value, int | float):
        return float.__repr__(float(value))
    raise Fallback(f"a {type(value).__name__} parameter for a {kind} placeholder")


def _extra_ops(command: Command) -> list[Op]:
    ops = [Op(_INSERT_BLOB, (h, v)) for h, v in command.blobs.items()]
    for entry in command.entries:
        if entry.removed:
            ops.append(Op(_REMOVE_ENTRY, (entry.time, entry.session_id, entry.key)))
        else:
            ops.append(
                Op(
                    _UPSERT_ENTRY,
                    (entry.session_id, entry.key, entry.value, entry.time, entry.time),
                )
            )
    return ops


async def commit_fast(
    conn: asyncpg.Connection,
    batch: Sequence[Prepared],
    plans: Plans,
    heads: Heads,
    *,
    lock: int,
    channel: str,
    origin: str,
    own: Callable[[int, int], None],
) -> tuple[list[Outcome], list[RecordedEvent]]:
    """Commit the whole batch under advisory lock ``lock``, or raise
    :class:`Fallback` with nothing written.

    One statement, in its own implicit transaction: it commits before it
    answers, so ``own`` (the positions the batch took) is told after COMMIT;
    the store keeps a catch-up read from running meanwhile. Any exception but
    Fallback is the connection's: a cancelled attempt closes it.
    """
    aggregates = sorted(
        {new.aggregate_id for p in batch for new in p.command.events}
        | {agg for p in batch for agg in (p.command.expected or {})}
    )
    try:
        assumed = await heads.of(conn, aggregates)
        seqs = dict(assumed)
        op_ids: list[int] = []
        op_expect: list[int | None] = []
        op_off: list[int] = []
        op_run: list[int] = []
        #: The run the last op belongs to: its first op's index, its plan, its rows' ids.
        run_at = -1
        run_plan: Plan | None = None
        run_keys: set[Any] = set()
        args: list[str | None] = []
        unplaced: list[list[RecordedEvent]] = []
        holds: list[LeaseUse] = []
        #: Per event, the index (from 1) in ``holds`` of its command's lease use
        #: when the event is of that lease's session, else 0 (no fence).
        fence_lease: list[int] = []
        #: Records whose epoch the server gives (a take's), with their use's index.
        taken: list[tuple[RecordedEvent, int]] = []
        ref_at: list[int] = []
        ref_rec: list[int] = []
        placed_so_far = 0
        held = plans.held
        for prepared in batch:
            command = prepared.command
            if command.expected and mismatched(prepared, seqs.__getitem__):
                raise Fallback("a seq mismatch: a conflict, a replay or a stale head")
            lease = command.lease
            if lease is not None:
                holds.append(lease)
            records = []
            for new, (type_, data) in zip(command.events, prepared.encoded, strict=True):
                agg = new.aggregate_id
                epoch, use = None, 0
                if lease is not None and agg == lease.session_id:
                    use = len(holds)
                    if lease.kind != "take":
                        epoch = lease.epoch
                fence_lease.append(use)
                seq = seqs[agg] = seqs[agg] + 1
                placed_so_far += 1
                # The position is allocated under the lock, in the function:
                # projectors get a reference to it (see _PositionRef), and the
                # record gets the real one after COMMIT (see below).
                records.append(
                    RecordedEvent(
                        position=_REFS[placed_so_far]
                        if placed_so_far < _MADE_REFS
                        else _PositionRef(placed_so_far),
                        id=new.id,
                        aggregate_id=agg,
                        seq=seq,
                        type=type_,
                        created=new.created,
                        data=data,
                        event=new.event,
                        epoch=epoch,
                    )
                )
                if use and epoch is None:
                    taken.append((records[-1], use))
            # The command's checks first, then its projections, in one order
            # with the other commands' ops: a check that fails rolls back all.
            ops: Sequence[Op] = (
                project(records[0])
                if len(records) == 1 and not command.checks
                else [*command.checks, *(op for r in records for op in project(r))]
            )
            if command.blobs or command.entries:
                ops = [*ops, *_extra_ops(command)]
            for op in ops:
                sql, params, expect = op.sql, op.params, op.expect
                plan = held(sql) or await plans.plan(conn, sql)
                if plan is None or len(params) != len(plan.kinds):
                    raise Fallback("an op this path cannot hold")
                # A run's length, negative while every op of it expects its row.
                if plan.run is not None and plan is run_plan and params[-1] not in run_keys:
                    length = op_run[run_at]
                    op_run[run_at] = length - 1 if length < 0 and expect == 1 else abs(length) + 1
                    op_run.append(0)
                else:
                    run_at, run_plan, run_keys = len(op_run), plan, set()
                    op_run.append(-1 if expect == 1 else 1)
                if plan.run is not None:
                    run_keys.add(params[-1])
                op_ids.append(plan.id)
                op_expect.append(expect)
                op_off.append(len(args))
                for kind, value in zip(plan.kinds, params, strict=True):
                    # The two usual cases inline; _as_text decides the others.
                    cls = value.__class__
                    if cls is str and kind == "text" and "\x00" not in value:
                        args.append(value)
                    elif cls is int and kind == "int":
                        args.append(int.__repr__(value))
                    elif cls is _PositionRef:
                        if kind != "int":
                            raise Fallback("a position bound to a parameter that is not an integer")
                        ref_at.append(len(args) + 1)
                        ref_rec.append(value.index)
                        args.append(None)
                    else:
                        args.append(_as_text(kind, value))
            unplaced.append(records)
        await plans.install(conn)
        flat = [r for records in unplaced for r in records]
        prefix, bodies = parts(origin, flat)
        appended = {r.aggregate_id for r in flat}
        checked = [agg for agg in aggregates if agg not in appended]
        texts: dict[str, Sequence[str | None] | None] = {
            "aggs": checked,
            "ev_id": [r.id for r in flat],
            "ev_agg": [r.aggregate_id for r in flat],
            "ev_type": [r.type for r in flat],
            "ev_data": [r.data for r in flat],
            "args": args,
            "bodies": bodies if flat else [],
            "hold_session": [h.session_id for h in holds] if holds else None,
            "hold_host": [h.host_id for h in holds],
            "hold_kind": [h.kind for h in holds],
        }
        ints: dict[str, Sequence[int | None]] = {
            "heads": [assumed[agg] for agg in checked],
            "ev_seq": [r.seq for r in flat],
            "ev_created": [r.created for r in flat],
            "op": op_ids,
            "expect": op_expect,
            "off": op_off,
            "run": op_run,
            "hold_epoch": [0 if h.kind == "take" else h.epoch for h in holds],
            "hold_ttl": [h.ttl_ms for h in holds],
            "fence_lease": fence_lease,
            "ref_at": ref_at,
            "ref_rec": ref_rec,
        }
        packed = [None if (v := texts[n]) is None else _packed(v) for n in _TEXT_ARRAYS]
        joined = [_joined(ints[name]) for name, _ in _INT_ARRAYS]
        returned = await conn.fetchval(_CALL, lock, channel, origin, prefix, packed, joined)
    except Fallback:
        heads.forget(aggregates)
        raise
    except Exception as exc:
        heads.forget(aggregates)
        if conn.is_closed() or isinstance(exc, OSError | asyncpg.ConnectionDoesNotExistError):
            raise
        raise Fallback(f"{type(exc).__name__}: {exc}") from exc
    except BaseException:
        heads.forget(aggregates)
        conn.terminate()  # cancelled: whether it committed is unknown
        raise
    heads.moved(seqs)
    # The records get their positions in place: they were made above, for this
    # batch alone, and nothing has seen them but the projectors (whose ops hold
    # the references, not the records); a copy of each cost twice as much.
    positions, epochs = returned[: len(flat)], returned[len(flat) :]
    for record, position in zip(flat, positions, strict=True):
        _place(record, "position", position)
    for record, use in taken:  # a take's epoch is the server's
        _place(record, "epoch", epochs[use - 1])
    if flat:
        own(flat[0].position, flat[-1].position)
    return [Outcome(records=records) for records in unplaced], flat
