"""Which directories a session may have as its Location.

A session's Location is where its tools act and its attachments come from,
so it is checked wherever one is set (session creation, whatever the
request's Location came from; the runtime's configured default at start):

- an absolute path without NUL bytes,
- that exists and is a directory (after resolving symlinks),
- that is not ``/`` and not the server's data directory nor inside it (the
  database and the managed tool output live there), unless the operator lists
  it in ``allowed`` (``[runtime] allow_directories``). Paths are compared
  resolved, so a symlink to ``/`` is ``/``.

The directory is stored as the client gave it; the tools resolve it again
on every use.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Final

import attrs

from protocol.errors import InvalidRequestError

__all__ = ["FIELD", "DirectoryRules"]

FIELD: Final = "location.directory"


def _paths(values: Iterable[str | os.PathLike[str]]) -> tuple[Path, ...]:
    return tuple(Path(v) for v in values)


@attrs.frozen(kw_only=True)
class DirectoryRules:
    #: The server's data directory: refused, and everything below it.
    data_dir: Path | None = None
    #: Directories the operator allows although a rule above refuses them.
    allowed: tuple[Path, ...] = attrs.field(default=(), converter=_paths)

    def check(self, directory: str, *, field: str = FIELD) -> None:
        """Refuse ``directory`` unless a session may live there (blocking: stats it).

        Raises:
            InvalidRequestError: ``field`` names the directory; the message says why.
        """

        def refuse(why: str) -> InvalidRequestError:
            return InvalidRequestError(f"{field} {why}", field=field)

        if "\0" in directory:
            raise refuse("must not contain NUL bytes")
        if not os.path.isabs(directory):
            raise refuse("must be an absolute path")
        real = Path(directory).resolve()
        if not real.exists():
            raise refuse(f"{directory!r} does not exist")
        if not real.is_dir():
            raise refuse(f"{directory!r} is not a directory")
        if any(real == allowed.resolve() for allowed in self.allowed):
            return
        if real == Path(real.anchor):
            raise refuse("must not be the root directory (the operator can allow it)")
        if self.data_dir is not None and real.is_relative_to(self.data_dir.resolve()):
            raise refuse("must not be the server's data directory (the operator can allow it)")
