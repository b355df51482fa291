-- The PostgreSQL schema as the build before issue 38 wrote it (storage/postgres/schema.py
-- at 8605a2b), one migration per '-- version N' section, verbatim.
-- version 1
CREATE SEQUENCE event_position AS BIGINT;
CREATE TABLE event (
    position     BIGINT PRIMARY KEY DEFAULT nextval('event_position'),
    id           TEXT NOT NULL UNIQUE,
    aggregate_id TEXT NOT NULL,
    seq          BIGINT NOT NULL CHECK (seq >= 1),
    type         TEXT NOT NULL,
    created      BIGINT NOT NULL,
    data         TEXT NOT NULL,
    UNIQUE (aggregate_id, seq)
);
ALTER SEQUENCE event_position OWNED BY event.position;

CREATE TABLE session (
    id                 TEXT PRIMARY KEY,
    parent_id          TEXT,
    title              TEXT NOT NULL,
    agent              TEXT,
    model              TEXT,
    directory          TEXT NOT NULL,
    metadata           TEXT,
    cost               DOUBLE PRECISION NOT NULL DEFAULT 0,
    tokens_input       BIGINT NOT NULL DEFAULT 0,
    tokens_output      BIGINT NOT NULL DEFAULT 0,
    tokens_reasoning   BIGINT NOT NULL DEFAULT 0,
    tokens_cache_read  BIGINT NOT NULL DEFAULT 0,
    tokens_cache_write BIGINT NOT NULL DEFAULT 0,
    time_created       BIGINT NOT NULL,
    time_updated       BIGINT NOT NULL
);
CREATE INDEX session_parent ON session (parent_id);
CREATE INDEX session_updated ON session (time_updated, id);

CREATE TABLE session_message (
    id           TEXT PRIMARY KEY,
    session_id   TEXT NOT NULL REFERENCES session (id) ON DELETE CASCADE,
    type         TEXT NOT NULL,
    seq          BIGINT NOT NULL,
    time_created BIGINT NOT NULL,
    time_updated BIGINT NOT NULL,
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
    enqueued_seq BIGINT NOT NULL,
    time_created BIGINT NOT NULL,
    UNIQUE (session_id, enqueued_seq)
);
CREATE INDEX session_inbox_delivery ON session_inbox (session_id, delivery, enqueued_seq);

CREATE FUNCTION _sessionrt_path(path text) RETURNS text[] LANGUAGE sql IMMUTABLE STRICT AS
$$ SELECT coalesce(string_to_array(nullif(substr(path, 3), ''), '.'), '{}'::text[]) $$;

-- SQLite's json_extract: a string as its text, JSON null as NULL, anything else as JSON text.
CREATE FUNCTION _sessionrt_sql_value(v json) RETURNS text LANGUAGE sql IMMUTABLE STRICT AS
$$ SELECT CASE json_typeof(v) WHEN 'string' THEN v #>> '{}' WHEN 'null' THEN NULL
   ELSE v::text END $$;

CREATE FUNCTION json(doc text) RETURNS json LANGUAGE sql IMMUTABLE STRICT AS
$$ SELECT doc::json $$;

-- PostgreSQL text cannot hold U+0000 and its JSON functions refuse the escape, so a read
-- sees U+FFFD there instead (the stored text keeps the escape).
CREATE FUNCTION _sessionrt_readable(doc text) RETURNS json LANGUAGE sql IMMUTABLE STRICT AS
$$ SELECT replace(doc, '\u0000', '\ufffd')::json $$;

CREATE FUNCTION json_extract(doc text, path text) RETURNS text LANGUAGE sql IMMUTABLE STRICT AS
$$ SELECT _sessionrt_sql_value(_sessionrt_readable(doc) #> _sessionrt_path(path)) $$;

-- Top-level members: existing ones keep their place, new ones follow in argument order.
CREATE FUNCTION _sessionrt_json_set(doc text, paths text[], vals json[]) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
  WITH k AS (
    SELECT substr(p, 3) AS key, vals[i] AS val, i FROM unnest(paths) WITH ORDINALITY AS u(p, i)
  ), old AS (
    SELECT e.key, e.value, e.o FROM json_each(doc::json) WITH ORDINALITY AS e(key, value, o)
  ), merged AS (
    SELECT old.key, coalesce((SELECT k.val::text FROM k WHERE k.key = old.key
                              ORDER BY k.i DESC LIMIT 1), old.value::text) AS val, old.o AS o
    FROM old
    UNION ALL
    SELECT k.key, k.val::text, 1000000 + k.i FROM k
    WHERE NOT EXISTS (SELECT 1 FROM old WHERE old.key = k.key)
      AND NOT EXISTS (SELECT 1 FROM k k2 WHERE k2.key = k.key AND k2.i > k.i)
  )
  SELECT '{' || coalesce(string_agg(to_json(key)::text || ':' || val, ',' ORDER BY o), '') || '}'
  FROM merged
$$;
CREATE FUNCTION json_set(doc text, p1 text, v1 json) RETURNS text LANGUAGE sql IMMUTABLE AS $$ SELECT _sessionrt_json_set(doc, ARRAY[p1], ARRAY[v1]) $$;
CREATE FUNCTION json_set(doc text, p1 text, v1 json, p2 text, v2 json) RETURNS text LANGUAGE sql IMMUTABLE AS $$ SELECT _sessionrt_json_set(doc, ARRAY[p1, p2], ARRAY[v1, v2]) $$;
CREATE FUNCTION json_set(doc text, p1 text, v1 json, p2 text, v2 json, p3 text, v3 json) RETURNS text LANGUAGE sql IMMUTABLE AS $$ SELECT _sessionrt_json_set(doc, ARRAY[p1, p2, p3], ARRAY[v1, v2, v3]) $$;
CREATE FUNCTION json_set(doc text, p1 text, v1 json, p2 text, v2 json, p3 text, v3 json, p4 text, v4 json) RETURNS text LANGUAGE sql IMMUTABLE AS $$ SELECT _sessionrt_json_set(doc, ARRAY[p1, p2, p3, p4], ARRAY[v1, v2, v3, v4]) $$;
CREATE FUNCTION json_set(doc text, p1 text, v1 json, p2 text, v2 json, p3 text, v3 json, p4 text, v4 json, p5 text, v5 json) RETURNS text LANGUAGE sql IMMUTABLE AS $$ SELECT _sessionrt_json_set(doc, ARRAY[p1, p2, p3, p4, p5], ARRAY[v1, v2, v3, v4, v5]) $$;
CREATE FUNCTION json_set(doc text, p1 text, v1 json, p2 text, v2 json, p3 text, v3 json, p4 text, v4 json, p5 text, v5 json, p6 text, v6 json) RETURNS text LANGUAGE sql IMMUTABLE AS $$ SELECT _sessionrt_json_set(doc, ARRAY[p1, p2, p3, p4, p5, p6], ARRAY[v1, v2, v3, v4, v5, v6]) $$;
CREATE FUNCTION json_set(doc text, p1 text, v1 json, p2 text, v2 json, p3 text, v3 json, p4 text, v4 json, p5 text, v5 json, p6 text, v6 json, p7 text, v7 json) RETURNS text LANGUAGE sql IMMUTABLE AS $$ SELECT _sessionrt_json_set(doc, ARRAY[p1, p2, p3, p4, p5, p6, p7], ARRAY[v1, v2, v3, v4, v5, v6, v7]) $$;
CREATE FUNCTION json_set(doc text, p1 text, v1 json, p2 text, v2 json, p3 text, v3 json, p4 text, v4 json, p5 text, v5 json, p6 text, v6 json, p7 text, v7 json, p8 text, v8 json) RETURNS text LANGUAGE sql IMMUTABLE AS $$ SELECT _sessionrt_json_set(doc, ARRAY[p1, p2, p3, p4, p5, p6, p7, p8], ARRAY[v1, v2, v3, v4, v5, v6, v7, v8]) $$;

-- RFC 7396, as SQLite's json_patch.
CREATE FUNCTION _sessionrt_merge_patch(target jsonb, patch jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  k text;
  v jsonb;
BEGIN
  IF patch IS NULL OR jsonb_typeof(patch) <> 'object' THEN
    RETURN patch;
  END IF;
  IF target IS NULL OR jsonb_typeof(target) <> 'object' THEN
    target := '{}'::jsonb;
  END IF;
  FOR k, v IN SELECT key, value FROM jsonb_each(patch) LOOP
    IF jsonb_typeof(v) = 'null' THEN
      target := target - k;
    ELSE
      target := jsonb_set(target, ARRAY[k], _sessionrt_merge_patch(target -> k, v), true);
    END IF;
  END LOOP;
  RETURN target;
END $$;

CREATE FUNCTION json_patch(target text, patch text) RETURNS text LANGUAGE sql IMMUTABLE STRICT AS
$$ SELECT _sessionrt_merge_patch(target::jsonb, patch::jsonb)::text $$;

-- json_each over an array: (index, element as json_extract gives it).
CREATE FUNCTION json_each(doc text, path text) RETURNS TABLE (key bigint, value text)
LANGUAGE sql IMMUTABLE STRICT AS $$
  SELECT e.o - 1, _sessionrt_sql_value(e.v)
  FROM json_array_elements(_sessionrt_readable(doc) #> _sessionrt_path(path))
       WITH ORDINALITY AS e(v, o)
$$;

CREATE FUNCTION _sessionrt_array_add(acc text, v json) RETURNS text LANGUAGE sql IMMUTABLE AS
$$ SELECT CASE WHEN acc IS NULL THEN '[' ELSE acc || ',' END || coalesce(v::text, 'null') $$;
CREATE FUNCTION _sessionrt_array_end(acc text) RETURNS text LANGUAGE sql IMMUTABLE AS
$$ SELECT coalesce(acc, '[') || ']' $$;
CREATE AGGREGATE json_group_array(json) (
  SFUNC = _sessionrt_array_add, STYPE = text, FINALFUNC = _sessionrt_array_end
);

CREATE FUNCTION _sessionrt_total_add(acc double precision, v text) RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$ SELECT acc + coalesce(v::double precision, 0) $$;
CREATE AGGREGATE total(text) (
  SFUNC = _sessionrt_total_add, STYPE = double precision, INITCOND = '0'
);

-- SQLite's scalar max(a, b) (the aggregate max keeps its one-argument form).
CREATE FUNCTION max(a bigint, b bigint) RETURNS bigint LANGUAGE sql IMMUTABLE AS
$$ SELECT CASE WHEN a IS NULL OR b IS NULL THEN NULL ELSE greatest(a, b) END $$;
-- version 2
ALTER TABLE session ADD COLUMN time_claimed BIGINT;
ALTER TABLE session ADD COLUMN resume_attempts BIGINT NOT NULL DEFAULT 0;
CREATE INDEX session_claimed ON session (time_claimed) WHERE time_claimed IS NOT NULL;

CREATE TABLE session_part (
    message_id TEXT NOT NULL REFERENCES session_message (id) ON DELETE CASCADE,
    session_id TEXT NOT NULL,
    key        TEXT NOT NULL,
    position   BIGINT NOT NULL,
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
    pgid        BIGINT NOT NULL,
    start_ticks BIGINT NOT NULL,
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
    asked_seq    BIGINT NOT NULL,
    time_created BIGINT NOT NULL,
    data         TEXT NOT NULL
);
CREATE INDEX session_permission_status ON session_permission (session_id, status, asked_seq);
CREATE INDEX session_permission_call ON session_permission (message_id, call_id);
-- version 6
CREATE TABLE instruction_state (
    session_id     TEXT PRIMARY KEY REFERENCES session (id) ON DELETE CASCADE,
    epoch_start    BIGINT NOT NULL,
    through_seq    BIGINT NOT NULL,
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
    removed      BIGINT NOT NULL DEFAULT 0,
    time_created BIGINT NOT NULL,
    time_updated BIGINT NOT NULL,
    PRIMARY KEY (session_id, key)
);
-- version 7
ALTER TABLE session ADD COLUMN revert TEXT;
-- version 8
ALTER TABLE session ADD COLUMN fork_session_id TEXT;
ALTER TABLE session ADD COLUMN fork_boundary TEXT;
ALTER TABLE session ADD COLUMN time_idle BIGINT;
ALTER TABLE session ADD COLUMN time_viewed BIGINT;
-- version 9
CREATE TABLE session_lease (
    session_id TEXT PRIMARY KEY,
    host_id    TEXT NOT NULL,
    epoch      BIGINT NOT NULL CHECK (epoch >= 1),
    expires    BIGINT NOT NULL
);
CREATE INDEX session_lease_host ON session_lease (host_id, expires);

CREATE TABLE event_fence (
    position   BIGINT PRIMARY KEY,
    session_id TEXT NOT NULL,
    host_id    TEXT NOT NULL,
    epoch      BIGINT NOT NULL
);
CREATE INDEX event_fence_session ON event_fence (session_id, epoch);
-- version 10
ALTER TABLE session_message ADD COLUMN changed BIGINT NOT NULL DEFAULT 0;
ALTER TABLE session_part ADD COLUMN changed BIGINT NOT NULL DEFAULT 0;
CREATE INDEX session_message_changed ON session_message (session_id, changed);
CREATE INDEX session_part_changed ON session_part (session_id, changed);
-- version 11
DROP INDEX event_fence_session;
-- version 12
ALTER TABLE session ADD COLUMN removals BIGINT NOT NULL DEFAULT 0;
-- version 13
DROP INDEX session_parent;
CREATE INDEX session_parent ON session (parent_id) WHERE parent_id IS NOT NULL;
-- version 14
ALTER TABLE session ADD COLUMN time_bucket BIGINT
    GENERATED ALWAYS AS (time_updated / 1000) STORED;
DROP INDEX session_updated;
CREATE INDEX session_updated ON session (time_bucket);
-- version 15
CREATE UNLOGGED TABLE log_listener (
    origin  TEXT PRIMARY KEY,
    pid     INTEGER,
    expires BIGINT
);
