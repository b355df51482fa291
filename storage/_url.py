"""Database URLs: which backend a ``database`` setting names, and how to show one safely."""

from __future__ import annotations

from typing import Final
from urllib.parse import urlsplit, urlunsplit

__all__ = ["is_postgres_url", "redact"]

_SCHEMES: Final = ("postgresql", "postgres")


def is_postgres_url(url: str) -> bool:
    return urlsplit(url).scheme in _SCHEMES if "://" in url else False


def redact(url: str) -> str:
    """``url`` with its password replaced by ``***``, fit for a log line or an error."""
    try:
        parts = urlsplit(url)
        password = parts.password
        port = parts.port
    except ValueError:
        return "<unreadable database URL>"
    if password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if port is not None:
        host = f"{host}:{port}"
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))
