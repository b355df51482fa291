"""The shared SQL, as PostgreSQL reads it: ``?`` placeholders become ``$1, $2, …``.

Projectors and queries are written once, in SQL both engines accept; the
SQLite functions they call exist in the PostgreSQL schema under the same
names (see :mod:`.schema`), so the placeholders are all that differs. A
``?`` inside a string literal stays as it is. Translations are cached by
statement text, at most :data:`CACHE_STATEMENTS` of them (the shared SQL is
a few hundred distinct statements; the bound only matters for generated
ones, e.g. an ``IN`` list).
"""

from __future__ import annotations

import functools
import itertools
import re
from typing import Final

__all__ = ["CACHE_STATEMENTS", "translate"]

#: Statements whose translation is kept (least recently used evicted first).
CACHE_STATEMENTS: Final = 1024

#: A string literal (its doubled quotes inside), or a placeholder.
_TOKEN: Final = re.compile(r"'(?:[^']|'')*'|\?")


@functools.lru_cache(maxsize=CACHE_STATEMENTS)
def translate(sql: str) -> str:
    numbers = itertools.count(1)
    return _TOKEN.sub(lambda m: m[0] if m[0] != "?" else f"${next(numbers)}", sql)
