"""How ``sessionrt serve`` logs: plain lines or (``--log-format json``) one JSON object a line.

A JSON line holds ``time`` (epoch ms), ``level``, ``logger``, ``event`` (the
message) and whatever the call passed as ``extra={"fields": {...}}``, plus
``exception`` (the formatted traceback) when there is one. Secrets never
reach a line: the caller logs no password or key, and as a last guard every
configured secret is replaced by ``***`` in the finished line, whatever
produced it (an exception message quoting a header, a path).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from typing import Any, Final, Literal, TextIO

import orjson

__all__ = ["LogFormat", "configure"]

LogFormat = Literal["text", "json"]

_REDACTED: Final = "***"
_TEXT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _Redacting(logging.Formatter):
    def __init__(self, secrets: Iterable[str], fmt: str | None = None) -> None:
        super().__init__(fmt)
        # Longest first: a secret that contains another is replaced whole.
        self._secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def redact(self, line: str) -> str:
        for secret in self._secrets:
            line = line.replace(secret, _REDACTED)
        return line

    def format(self, record: logging.LogRecord) -> str:
        return self.redact(super().format(record) + _fields_text(record))


class _Json(_Redacting):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": int(record.created * 1000),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            for key, value in fields.items():
                line.setdefault(str(key), value)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return self.redact(orjson.dumps(line, default=str).decode())


def _fields_text(record: logging.LogRecord) -> str:
    fields = getattr(record, "fields", None)
    if not isinstance(fields, dict) or not fields:
        return ""
    return " " + " ".join(f"{k}={v}" for k, v in fields.items())


def configure(
    fmt: LogFormat, *, secrets: Iterable[str] = (), stream: TextIO | None = None
) -> logging.Handler:
    """Send ``sessionrt`` loggers' INFO and above to ``stream`` (stderr) in ``fmt``."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(_Json(secrets) if fmt == "json" else _Redacting(secrets, _TEXT))
    levels = dict.fromkeys(("sessionrt", "server", "actors", "storage", "protocol"), logging.INFO)
    levels["aiohttp"] = logging.WARNING
    for name, level in levels.items():
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.setLevel(level)
        logger.propagate = False
    return handler
