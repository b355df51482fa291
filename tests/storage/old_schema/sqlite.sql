-- The SQLite schema as the build before issue 38 wrote it (storage/schema.py at 8605a2b),
-- one migration per '-- version N' section, verbatim.
-- version 1
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
-- version 2
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
-- version 3
ALTER TABLE session ADD COLUMN retry TEXT;
-- version 4
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
-- version 5
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
-- version 6
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
-- version 7
ALTER TABLE session ADD COLUMN revert TEXT;
-- version 8
ALTER TABLE session ADD COLUMN fork_session_id TEXT;
ALTER TABLE session ADD COLUMN fork_boundary TEXT;
ALTER TABLE session ADD COLUMN time_idle INTEGER;
ALTER TABLE session ADD COLUMN time_viewed INTEGER;
-- version 9
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
-- version 10
ALTER TABLE session_message ADD COLUMN changed INTEGER NOT NULL DEFAULT 0;
ALTER TABLE session_part ADD COLUMN changed INTEGER NOT NULL DEFAULT 0;
CREATE INDEX session_message_changed ON session_message (session_id, changed);
CREATE INDEX session_part_changed ON session_part (session_id, changed);
-- version 11
DROP INDEX event_fence_session;
-- version 12
ALTER TABLE session ADD COLUMN removals INTEGER NOT NULL DEFAULT 0;
-- version 13
DROP INDEX session_parent;
CREATE INDEX session_parent ON session (parent_id) WHERE parent_id IS NOT NULL;
-- version 14
ALTER TABLE session ADD COLUMN time_bucket INTEGER
    GENERATED ALWAYS AS (time_updated / 1000) VIRTUAL;
DROP INDEX session_updated;
CREATE INDEX session_updated ON session (time_bucket, time_updated, id);
-- version 15

