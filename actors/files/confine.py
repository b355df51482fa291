"""Path confinement: where a path really leads, and whether that is inside a root.

One rule serves every reader of session-supplied paths (the file tools, prompt
attachments): a path is taken relative to the root (or as given, if
absolute) and resolved with :meth:`Path.resolve`, which removes ``..`` and
follows every symlink, so ``../x``, ``/etc/passwd`` and ``link-to-outside/x``
are all judged by where they really lead, never by how they are spelled.

The check and the later open are separate system calls; a process that swaps
a symlink in between can still race us. Confinement keeps an honest model (and
a remote client) inside a session's Location; it is not a sandbox against a
hostile local process.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Final, Literal

__all__ = ["PROJECT_CONFIG_DIR", "PathRefused", "confined", "inside", "resolve"]

#: A project's sessionrt configuration inside its directory (``agents.toml``);
#: tools may not write it without the operator's ``config`` permission.
PROJECT_CONFIG_DIR: Final = ".sessionrt"

Reason = Literal["invalid", "outside"]


class PathRefused(Exception):
    """A path cannot be used: ``invalid`` (unparsable) or ``outside`` its root."""

    def __init__(self, message: str, *, reason: Reason) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason


def resolve(root: Path, raw: str | Path) -> Path:
    """Where ``raw`` (relative to ``root`` unless absolute) really leads.

    Blocking (it reads symlinks). ``root`` should itself be resolved.

    Raises:
        PathRefused: ``invalid`` for a NUL byte or a symlink loop.
    """
    try:
        candidate = Path(raw)
        return (candidate if candidate.is_absolute() else root / candidate).resolve()
    except (ValueError, OSError) as exc:  # NUL bytes, symlink loops
        raise PathRefused(str(exc), reason="invalid") from exc


def inside(target: Path, roots: Iterable[Path]) -> bool:
    """Whether the resolved ``target`` is one of ``roots`` or below one of them."""
    return any(target.is_relative_to(root) for root in roots)


def confined(root: Path, raw: str | Path) -> Path:
    """:func:`resolve`, refusing anything that does not lead inside ``root``.

    Raises:
        PathRefused: ``invalid``, or ``outside``.
    """
    location = root.resolve()
    target = resolve(location, raw)
    if not target.is_relative_to(location):
        raise PathRefused(f"outside the session's directory ({location})", reason="outside")
    return target
