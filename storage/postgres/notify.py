"""Commit notifications across processes: the NOTIFY payload and its parsing.

A batch that commits sends, in its own transaction, one or more NOTIFYs on the
store's channel. Each payload is lines of ASCII text::

    v1 <origin> <first position> <last position>
    <aggregate id> <latest seq>
    …

``origin`` identifies the sending store (so it skips its own commits, which
it already told its subscribers), the position range is what a listener
reads back from the ``event`` table (followers read rows, never payloads),
and the (aggregate, seq) lines say which sessions moved, for a listener that
only needs a doorbell. A batch touching many sessions is split into several
payloads, each under PostgreSQL's 8000-byte limit and each repeating the
header; a listener reads a batch's range once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import attrs

from storage.recorder import RecordedEvent

__all__ = ["MAX_PAYLOAD", "Notice", "parse", "payloads"]

#: Bytes per payload; PostgreSQL refuses 8000 and more.
MAX_PAYLOAD: Final = 7900


@attrs.frozen
class Notice:
    origin: str
    first: int
    last: int
    heads: tuple[tuple[str, int], ...]


def payloads(origin: str, records: Sequence[RecordedEvent]) -> list[str]:
    """The NOTIFY payloads announcing ``records`` (one committed batch)."""
    if not records:
        return []
    heads: dict[str, int] = {}
    for r in records:
        heads[r.aggregate_id] = max(r.seq, heads.get(r.aggregate_id, 0))
    header = f"v1 {origin} {min(r.position for r in records)} {max(r.position for r in records)}"
    out: list[str] = []
    lines = [header]
    size = len(header)
    for agg, seq in heads.items():
        line = f"{agg} {seq}"
        if size + 1 + len(line) > MAX_PAYLOAD and len(lines) > 1:
            out.append("\n".join(lines))
            lines, size = [header], len(header)
        lines.append(line)
        size += 1 + len(line)
    out.append("\n".join(lines))
    return out


def parse(payload: str) -> Notice | None:
    """The notice in ``payload``; None for one this build cannot read."""
    lines = payload.split("\n")
    head = lines[0].split(" ")
    if len(head) != 4 or head[0] != "v1":
        return None
    try:
        heads = tuple(
            (agg, int(seq)) for agg, _, seq in (line.partition(" ") for line in lines[1:])
        )
        return Notice(origin=head[1], first=int(head[2]), last=int(head[3]), heads=heads)
    except ValueError:
        return None
