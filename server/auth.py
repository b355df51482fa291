"""Optional password auth: HTTP Basic (any user name) or Bearer, compared in constant time."""

from __future__ import annotations

import base64
import binascii
import hmac

__all__ = ["authorized"]


def authorized(header: str | None, password: str) -> bool:
    if not header:
        return False
    scheme, _, value = header.partition(" ")
    value = value.strip()
    expected = password.encode()
    if scheme.lower() == "bearer":
        # Header bytes that are not UTF-8 arrive as surrogates: compare them as the
        # bytes they were (never equal to a password, never an encoding error).
        return hmac.compare_digest(value.encode("utf-8", "surrogateescape"), expected)
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            return False
        _, sep, given = decoded.partition(b":")
        return bool(sep) and hmac.compare_digest(given, expected)
    return False
