"""Database URLs, shown safely: a password never reaches a log line, an error or a repr."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

__all__ = ["redact"]


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
