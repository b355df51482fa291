"""The PostgreSQL backend (optional: ``pip install 'sessionrt[postgres]'``, asyncpg).

Several sessionrt processes, on several hosts, may share one database; see
:mod:`storage.postgres.store` for the surface and :mod:`storage.postgres._writer`
for the ordering guarantees.
"""

from storage.postgres._writer import LOG_LOCK, CommandGuard
from storage.postgres.dialect import translate
from storage.postgres.store import CHANNEL, PostgresStore

__all__ = ["CHANNEL", "LOG_LOCK", "CommandGuard", "PostgresStore", "translate"]
