"""Commit notifications across processes: the NOTIFY payload and its parsing.

A batch that commits sends, in its own transaction, one or more NOTIFYs on the
store's channel, when a process of another origin listens (:mod:`.listeners`).
Each payload is lines of ASCII text::

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

__all__ = ["MAX_PAYLOAD", "Notice", "own_prefix", "parse", "payloads"]

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
    header = f"v1 {origin} {min(r.position for r in records)} {max(r.position for r in records)}"
    return [header + body for body in _bodies(_heads(records), len(header))]


def _heads(records: Sequence[RecordedEvent]) -> dict[str, int]:
    """Each aggregate's latest seq among ``records``: its last record's, as a
    batch's records come in commit order (an aggregate's seqs rise with it)."""
    return {r.aggregate_id: r.seq for r in records}


def _bodies(heads: dict[str, int], header: int) -> list[str]:
    """The ``"\\n<aggregate> <seq>"`` lines, in chunks that fit after a ``header``-long line."""
    lines = [f"\n{agg} {seq}" for agg, seq in heads.items()]
    whole = "".join(lines)
    if header + len(whole) <= MAX_PAYLOAD:
        return [whole]  # nearly every batch: one payload
    out: list[str] = []
    body: list[str] = []
    size = header
    for line in lines:
        if size + len(line) > MAX_PAYLOAD and body:
            out.append("".join(body))
            body, size = [], header
        body.append(line)
        size += len(line)
    out.append("".join(body))
    return out


def own_prefix(origin: str) -> str:
    """How every payload ``origin`` sends begins (the trailing space: no origin is
    mistaken for one it is a prefix of)."""
    return f"v1 {origin} "


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
