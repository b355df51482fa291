"""The PostgreSQL backend (optional: ``pip install 'sessionrt[postgres]'``, asyncpg).

Several sessionrt processes, on several hosts, may share one database; see
:mod:`storage.postgres.store` for the surface and :mod:`storage.postgres.writer`
for the ordering guarantees.
"""

from storage.postgres.store import CHANNEL, PostgresStore
from storage.postgres.writer import LOG_LOCK

__all__ = ["CHANNEL", "LOG_LOCK", "PostgresStore"]
