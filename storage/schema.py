"""The schema of both backends and its forward migrations: one list, one version number.

Each :class:`Migration` is DDL both backends run, written as SQLite reads
it, and what one backend alone needs (PostgreSQL's position sequence and the
list of its notice listeners, an index shaped for its HOT updates). SQLite
runs the shared text as it is; PostgreSQL reads it once through
:data:`POSTGRES_TYPES`, the one place its types are chosen (``BIGINT`` for
SQLite's 64-bit ``INTEGER`` …). The runners are the backends' own
(:func:`storage._writer.migrate`, :func:`storage.postgres.schema.migrate`):
``schema_version`` holds one row, each migration runs in one transaction,
and a database newer than this build is refused rather than guessed at.
Projection tables are derived from ``event`` and can be rebuilt from it
(see :mod:`storage.rebuild`).
"""

from __future__ import annotations

import re
from typing import Final, Literal

import attrs

__all__ = [
    "MIGRATIONS",
    "POSTGRES_TYPES",
    "PROJECTION_TABLES",
    "SCHEMA_VERSION",
    "SESSION_BUCKET_MS",
    "Backend",
    "Migration",
]

Backend = Literal["sqlite", "postgres"]

#: PostgreSQL's word for each of the shared DDL's (SQLite's) types: SQLite's
#: INTEGER holds 64 bits, its REAL is a double; PostgreSQL 15 stores every
#: generated column.
POSTGRES_TYPES: Final = {"INTEGER": "BIGINT", "REAL": "DOUBLE PRECISION", "VIRTUAL": "STORED"}
_TYPE_WORD: Final = re.compile(r"\b(" + "|".join(POSTGRES_TYPES) + r")\b")


@attrs.frozen
class Migration:
    """One version's DDL: what both backends run, then what one alone runs."""

    both: str
    sqlite: str = ""
    postgres: str = ""

    def script(self, backend: Backend) -> str:
        """The DDL ``backend`` runs for this version."""
        if backend == "sqlite":
            return self.both + self.sqlite
        return _TYPE_WORD.sub(lambda m: POSTGRES_TYPES[m[1]], self.both) + self.postgres


_V1: Final = """
CREATE TABLE event (
    position     INTEGER PRIMARY KEY,
    id           TEXT NOT NULL UNIQUE,
    aggregate_id TEXT NOT NULL,
    seq          INTEGER NOT NULL CHECK (seq >= 1),
    type         TEXT NOT NULL,
    created      INTEGER NOT NULL,
    data         TEXT NOT NULL,
    UNIQUE (aggregate_id, seq)
);

CREATE TABLE session (
    id                 TEXT PRIMARY KEY,
    parent_id          TEXT,
    title              TEXT NOT NULL,
    agent              TEXT,
    model              TEXT,
    directory          TEXT NOT NULL,
    metadata           TEXT,
    cost               REAL NOT NULL DEFAULT 0,
    tokens_input       INTEGER NOT NULL DEFAULT 0,
    tokens_output      INTEGER NOT NULL DEFAULT 0,
    tokens_reasoning   INTEGER NOT NULL DEFAULT 0,
    tokens_cache_read  INTEGER NOT NULL DEFAULT 0,
    tokens_cache_write INTEGER NOT NULL DEFAULT 0,
    time_created       INTEGER NOT NULL,
    time_updated       INTEGER NOT NULL
);
CREATE INDEX session_parent ON session (parent_id);
CREATE INDEX session_updated ON session (time_updated, id);

CREATE TABLE session_message (
    id           TEXT PRIMARY KEY,
    session_id   TEXT NOT NULL REFERENCES session (id) ON DELETE CASCADE,
    type         TEXT NOT NULL,
    seq          INTEGER NOT NULL,
    time_created INTEGER NOT NULL,
    time_updated INTEGER NOT NULL,
    data         TEXT NOT NULL,
    UNIQUE (session_id, seq)
);
CREATE INDEX session_message_type ON session_message (session_id, type, seq);

CREATE TABLE session_inbox (
    id           TEXT PRIMARY KEY,
    session_id   TEXT NOT NULL REFERENCES session (id) ON DELETE CASCADE,
    type         TEXT NOT NULL,
    payload      TEXT NOT NULL,
    delivery     TEXT NOT NULL CHECK (delivery IN ('steer', 'queue')),
    enqueued_seq INTEGER NOT NULL,
    time_created INTEGER NOT NULL,
    UNIQUE (session_id, enqueued_seq)
);
CREATE INDEX session_inbox_delivery ON session_inbox (session_id, delivery, enqueued_seq);
"""
# PostgreSQL takes each batch's positions from a sequence (see
# storage.postgres.writer); the default serves hosts of an earlier build,
# whose writers insert without a position.
_V1_POSTGRES: Final = """
CREATE SEQUENCE event_position AS BIGINT OWNED BY event.position;
ALTER TABLE event ALTER COLUMN position SET DEFAULT nextval('event_position');
"""

# v2: execution claims (the write-ahead claim is time_claimed; the name says
# what it is) and assistant message parts, one row per text/reasoning/tool part
# so a part can be updated in place and open tool calls can be found by index.
_V2: Final = """
ALTER TABLE session ADD COLUMN time_claimed INTEGER;
ALTER TABLE session ADD COLUMN resume_attempts INTEGER NOT NULL DEFAULT 0;
CREATE INDEX session_claimed ON session (time_claimed) WHERE time_claimed IS NOT NULL;

CREATE TABLE session_part (
    message_id TEXT NOT NULL REFERENCES session_message (id) ON DELETE CASCADE,
    session_id TEXT NOT NULL,
    key        TEXT NOT NULL,
    position   INTEGER NOT NULL,
    status     TEXT,
    data       TEXT NOT NULL,
    PRIMARY KEY (message_id, key)
);
CREATE INDEX session_part_open ON session_part (session_id, status)
    WHERE status IN ('streaming', 'running');
"""

# v3: the retry a session waits for (session.retry.scheduled), as its JSON;
# NULL once later activity or a terminal cleared it.
_V3: Final = """
ALTER TABLE session ADD COLUMN retry TEXT;
"""

# v4: the process group of each running tool call (``session.tool.spawned``),
# until its terminal: what the next start must kill before failing the call.
_V4: Final = """
CREATE TABLE tool_process (
    message_id  TEXT NOT NULL,
    call_id     TEXT NOT NULL,
    session_id  TEXT NOT NULL REFERENCES session (id) ON DELETE CASCADE,
    pgid        INTEGER NOT NULL,
    start_ticks INTEGER NOT NULL,
    boot_id     TEXT NOT NULL,
    PRIMARY KEY (message_id, call_id)
);
CREATE INDEX tool_process_session ON tool_process (session_id);
"""

# v5: permission requests (``session.permission.asked``): ``pending`` until
# replied (``once``/``always``/``reject``) or until the call settled without an
# answer (``expired``). ``always`` rows are the session's recorded rules.
_V5: Final = """
CREATE TABLE session_permission (
    id           TEXT PRIMARY KEY,
    session_id   TEXT NOT NULL REFERENCES session (id) ON DELETE CASCADE,
    message_id   TEXT NOT NULL,
    call_id      TEXT NOT NULL,
    permission   TEXT NOT NULL,
    status       TEXT NOT NULL
        CHECK (status IN ('pending', 'once', 'always', 'reject', 'expired')),
    asked_seq    INTEGER NOT NULL,
    time_created INTEGER NOT NULL,
    data         TEXT NOT NULL
);
CREATE INDEX session_permission_status ON session_permission (session_id, status, asked_seq);
CREATE INDEX session_permission_call ON session_permission (message_id, call_id);
"""

# v6: instructions as value deltas. ``instruction_state`` is projected from
# ``session.instructions.updated`` and the epoch events (compaction, revert,
# fork). ``instruction_blob`` holds each distinct encoded value once
# (content-addressed, machine-local, written with the delta's commit; not
# derived from the log, so not a projection). ``instruction_entry`` holds the
# API-managed values (primary state, not derived from the log either).
_V6: Final = """
CREATE TABLE instruction_state (
    session_id     TEXT PRIMARY KEY REFERENCES session (id) ON DELETE CASCADE,
    epoch_start    INTEGER NOT NULL,
    through_seq    INTEGER NOT NULL,
    initial_values TEXT NOT NULL,
    current_values TEXT NOT NULL
);

CREATE TABLE instruction_blob (
    hash  TEXT PRIMARY KEY CHECK (length(hash) = 64),
    value TEXT NOT NULL
);

CREATE TABLE instruction_entry (
    session_id   TEXT NOT NULL REFERENCES session (id) ON DELETE CASCADE,
    key          TEXT NOT NULL,
    value        TEXT,
    removed      INTEGER NOT NULL DEFAULT 0,
    time_created INTEGER NOT NULL,
    time_updated INTEGER NOT NULL,
    PRIMARY KEY (session_id, key)
);
"""

# v7: the staged revert of a session (``session.revert.staged``), as its JSON;
# NULL when none is staged. Shell entries are ``session_message`` rows.
_V7: Final = """
ALTER TABLE session ADD COLUMN revert TEXT;
"""

# v8: session structure. A fork names its source session and boundary (JSON);
# time_idle is the session's last idle transition and time_viewed the newest
# one a client marked viewed, so "unread" is time_idle > time_viewed.
_V8: Final = """
ALTER TABLE session ADD COLUMN fork_session_id TEXT;
ALTER TABLE session ADD COLUMN fork_boundary TEXT;
ALTER TABLE session ADD COLUMN time_idle INTEGER;
ALTER TABLE session ADD COLUMN time_viewed INTEGER;
"""

# v9: execution leases and fencing (see :mod:`storage.lease`). Not projections:
# neither is derived from the log, and a rebuild keeps both. ``expires`` is in
# ms; a released lease has ``expires = 0``.
_V9: Final = """
CREATE TABLE session_lease (
    session_id TEXT PRIMARY KEY,
    host_id    TEXT NOT NULL,
    epoch      INTEGER NOT NULL CHECK (epoch >= 1),
    expires    INTEGER NOT NULL
);
CREATE INDEX session_lease_host ON session_lease (host_id, expires);

CREATE TABLE event_fence (
    position   INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL,
    host_id    TEXT NOT NULL,
    epoch      INTEGER NOT NULL
);
CREATE INDEX event_fence_session ON event_fence (session_id, epoch);
"""

# v10: a change marker on transcript rows: the position of the last event
# that wrote the row (set by every projector that inserts or updates one), so
# a reader holding a session's history re-reads only the rows changed since
# (see ``storage.queries.HistoryCache``). Rows from before v10 keep 0: a
# reader's first read of a session is always a full one.
_V10: Final = """
ALTER TABLE session_message ADD COLUMN changed INTEGER NOT NULL DEFAULT 0;
ALTER TABLE session_part ADD COLUMN changed INTEGER NOT NULL DEFAULT 0;
CREATE INDEX session_message_changed ON session_message (session_id, changed);
CREATE INDEX session_part_changed ON session_part (session_id, changed);
"""

# v11: no index on event_fence by session. Nothing in the runtime reads fences
# (they are evidence for crashsim and the tests, read whole), and the index
# was half the cost of the row an execution's every event adds.
_V11: Final = """
DROP INDEX event_fence_session;
"""

# v12: how many times rows have left a session's transcript (a committed
# revert deletes them): a reader holding the session's history compares it
# instead of counting the session's rows (see storage.queries.HistoryCache).
_V12: Final = """
ALTER TABLE session ADD COLUMN removals INTEGER NOT NULL DEFAULT 0;
"""

# v13: the parent index holds children only. Its one reader looks sessions up
# by a parent id (``parent_id = ?``), never for roots; and on PostgreSQL every
# update of a session row that cannot be HOT (any that moves time_updated,
# which session_updated indexes) inserts into every index whose predicate the
# row meets, so a root's edits stop paying for an entry nobody reads.
_V13: Final = """
DROP INDEX session_parent;
CREATE INDEX session_parent ON session (parent_id) WHERE parent_id IS NOT NULL;
"""

# v14: the session list walks a coarse key, time_bucket (time_updated in whole
# seconds: SESSION_BUCKET_MS), then sorts within it by (time_updated, id);
# the order is the same, as the bucket never decreases with time_updated. On
# PostgreSQL the list's index holds the bucket alone: an edit within the
# second of the session's last one then changes no indexed column, so it can
# be a HOT update (no new index entry, the old version pruned in place) where
# an index holding time_updated made every edit insert into every index.
# SQLite has no HOT; its index holds the whole order.
_V14: Final = """
ALTER TABLE session ADD COLUMN time_bucket INTEGER
    GENERATED ALWAYS AS (time_updated / 1000) VIRTUAL;
DROP INDEX session_updated;
"""
_V14_SQLITE: Final = """
CREATE INDEX session_updated ON session (time_bucket, time_updated, id);
"""
_V14_POSTGRES: Final = """
CREATE INDEX session_updated ON session (time_bucket);
"""

# v15: PostgreSQL's alone: the processes listening for its commit notices
# (see storage.postgres.listeners). A batch NOTIFYs only while a process
# other than its own store's is listed, so a host alone on its database
# sends none. UNLOGGED: the rows describe live connections, which a server
# crash ends anyway (and the crash recovery empties the table); each
# listener writes its row again whenever it connects. SQLite has no notices;
# the version still moves, so one number names one schema on both.
_V15_POSTGRES: Final = """
CREATE UNLOGGED TABLE log_listener (
    origin  TEXT PRIMARY KEY,
    pid     INTEGER,
    expires BIGINT
);
"""

# v16: a session being imported in several commands (actors.transfer) is
# hidden until its last one: ``importing`` is set by session.import.started
# and cleared by session.import.finished; every read of sessions skips a
# row that has it. The index finds the imports a dead process left behind.
_V16: Final = """
ALTER TABLE session ADD COLUMN importing INTEGER;
CREATE INDEX session_importing ON session (id) WHERE importing IS NOT NULL;
"""

#: Migration n (1-based) brings the schema from version n-1 to n.
MIGRATIONS: Final[tuple[Migration, ...]] = (
    Migration(_V1, postgres=_V1_POSTGRES),
    Migration(_V2),
    Migration(_V3),
    Migration(_V4),
    Migration(_V5),
    Migration(_V6),
    Migration(_V7),
    Migration(_V8),
    Migration(_V9),
    Migration(_V10),
    Migration(_V11),
    Migration(_V12),
    Migration(_V13),
    Migration(_V14, sqlite=_V14_SQLITE, postgres=_V14_POSTGRES),
    Migration("", postgres=_V15_POSTGRES),
    Migration(_V16),
)
SCHEMA_VERSION: Final = len(MIGRATIONS)
#: The width of ``session.time_bucket`` (v14), in milliseconds of time_updated.
SESSION_BUCKET_MS: Final = 1000

#: Tables derived from the event log, in dependency order (parents first).
PROJECTION_TABLES: Final = (
    "session",
    "session_message",
    "session_inbox",
    "session_part",
    "tool_process",
    "session_permission",
    "instruction_state",
)
