"""PostgreSQL's schema: the migrations of :mod:`storage.schema`, and SQLite's JSON functions.

:func:`migrate` runs each version's DDL as :meth:`storage.schema.Migration.script`
gives it for PostgreSQL (one list for both backends, one version number),
each in its own transaction under a transaction-scoped advisory lock, so
hosts starting together migrate once.

Version 1 also creates the SQLite JSON1 functions the shared projectors and
queries call (``json``, ``json_extract``, ``json_set``, ``json_patch``,
``json_each``, ``json_group_array``, ``total`` and the two-argument scalar
``max``). Keeping them in the database, under SQLite's names, is what lets
one set of projector and query SQL serve both backends; :mod:`.dialect` only
renumbers placeholders. JSON columns stay ``TEXT`` on both; the functions
work on the ``json`` type (verbatim text), not ``jsonb``, wherever they
can, so member order and the stored text survive; only ``json_patch`` (a
recursive merge) goes through ``jsonb``.

Limits, which the projectors respect: ``json_set`` paths name one top-level
member (``'$.key'``) and every value is passed through ``json()``;
``json_each`` iterates arrays. PostgreSQL cannot hold U+0000 in text: a
read (``json_extract``, ``json_each``) sees U+FFFD for it, and ``json_set`` or
``json_patch`` on a document that holds one fails its command alone.
"""

from __future__ import annotations

from typing import Final

import asyncpg

from storage.errors import StorageBrokenError
from storage.schema import MIGRATIONS, SCHEMA_VERSION

__all__ = ["FUNCTIONS", "migrate", "version"]

#: Pairs of (path, value) the ``json_set`` overloads accept.
_JSON_SET_PAIRS: Final = 8


def _json_set_overloads() -> str:
    out = []
    for n in range(1, _JSON_SET_PAIRS + 1):
        args = ", ".join(f"p{i} text, v{i} json" for i in range(1, n + 1))
        keys = ", ".join(f"p{i}" for i in range(1, n + 1))
        vals = ", ".join(f"v{i}" for i in range(1, n + 1))
        out.append(
            f"CREATE FUNCTION json_set(doc text, {args}) RETURNS text"
            " LANGUAGE sql IMMUTABLE AS"
            f" $$ SELECT _sessionrt_json_set(doc, ARRAY[{keys}], ARRAY[{vals}]) $$;"
        )
    return "\n".join(out)


#: SQLite's JSON functions, as version 1 creates them (see the module's docstring).
FUNCTIONS: Final = (
    r"""
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
"""
    + _json_set_overloads()
    + r"""

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
"""
)


#: Key of the transaction-scoped advisory lock migrations take ("sessmigr").
_MIGRATION_LOCK: Final = 0x7365_7373_6D69_6772


async def version(conn: asyncpg.Connection) -> int:
    """The database's schema version (0 before the first migration)."""
    if not await conn.fetchval("SELECT to_regclass('schema_version') IS NOT NULL"):
        return 0
    return int(await conn.fetchval("SELECT coalesce(max(version), 0) FROM schema_version"))


async def migrate(conn: asyncpg.Connection) -> int:
    """Bring the database to :data:`SCHEMA_VERSION`; return the version found."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK)
        await conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version BIGINT NOT NULL)")
        found = await version(conn)
    if found > SCHEMA_VERSION:
        raise StorageBrokenError(
            f"database schema version {found} is newer than this build ({SCHEMA_VERSION})"
        )
    for target in range(found + 1, SCHEMA_VERSION + 1):
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK)
            if await version(conn) >= target:
                continue  # another host migrated while we waited for the lock
            # A multi-statement string without parameters runs as one simple query.
            await conn.execute(MIGRATIONS[target - 1].script("postgres"))
            if target == 1:
                await conn.execute(FUNCTIONS)
            await conn.execute("DELETE FROM schema_version")
            await conn.execute("INSERT INTO schema_version (version) VALUES ($1)", target)
    return found
