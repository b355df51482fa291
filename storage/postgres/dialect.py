"""The shared SQL, as PostgreSQL reads it.

Projectors and queries are written once, in SQL both engines accept; the
SQLite JSON1 functions they call exist in the PostgreSQL schema under the
same names (see :mod:`.schema`). What is left to translate is lexical:
``?`` placeholders become ``$1, $2, …`` and ``json_object`` (whose SQLite
form PostgreSQL 15 lacks) becomes ``json_build_object``. String literals are
left alone. Translations are cached by statement text, at most
:data:`CACHE_STATEMENTS` of them (the shared SQL is a few hundred distinct
statements; the bound only matters for generated ones, e.g. an ``IN`` list).
"""

from __future__ import annotations

import functools
import re
from typing import Final

__all__ = ["CACHE_STATEMENTS", "affected", "translate", "translate_cast"]

#: Statements whose translation is kept (least recently used evicted first).
CACHE_STATEMENTS: Final = 1024

_RENAMES: Final = {"json_object": "json_build_object"}
_WORD: Final = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")


@functools.lru_cache(maxsize=CACHE_STATEMENTS)
def translate(sql: str) -> str:
    return _rewrite(sql)


@functools.lru_cache(maxsize=CACHE_STATEMENTS)
def translate_cast(sql: str, types: tuple[str, ...], form: str) -> str:
    """``translate``, with the n-th placeholder written ``form.format(n=n, type=types[n-1])``.

    For a statement whose parameters arrive as text and must keep the types
    the server inferred for them (see :mod:`._fast`). ``types`` and ``form``
    are the caller's own text (type names from a fixed list), never input.
    """
    return _rewrite(sql, types, form)


def _rewrite(sql: str, types: tuple[str, ...] = (), form: str = "") -> str:
    out: list[str] = []
    n = 0
    i = 0
    length = len(sql)
    while i < length:
        c = sql[i]
        if c == "'":
            end = i + 1
            while True:
                end = sql.index("'", end)
                if end + 1 < length and sql[end + 1] == "'":
                    end += 2  # a doubled quote inside the literal
                    continue
                break
            out.append(sql[i : end + 1])
            i = end + 1
        elif c == "?":
            n += 1
            out.append(form.format(n=n, type=types[n - 1]) if form else f"${n}")
            i += 1
        elif c.isalpha() or c == "_":
            word = _WORD.match(sql, i)
            assert word is not None
            text = word.group()
            out.append(
                _RENAMES.get(text.lower(), text) if sql.startswith("(", word.end()) else text
            )
            i = word.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def affected(status: str) -> int:
    """Rows a statement touched, from its command tag (``UPDATE 3``, ``INSERT 0 1``)."""
    tail = status.rpartition(" ")[2]
    return int(tail) if tail.isdigit() else 0
