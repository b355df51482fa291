#!/usr/bin/env python3
"""Crash simulator: SIGKILL a real ``sessionrt serve`` under load, restart it, check invariants.

    scripts/crashsim                                     # 8 sessions, 5 kills, a random seed
    .venv/bin/python scripts/crashsim.py --seed 7 --sessions 4 --iterations 10 --keep
    .venv/bin/python scripts/crashsim.py --json          # one JSON object on stdout

The run, on a fresh temporary directory (``--keep`` keeps it and prints its path):

1. ``sessionrt serve --port 0 --data-dir DIR/data`` (the console script next to
   ``sys.executable``) is started as a real subprocess, cwd ``DIR`` (where the sessions
   live, so where tools run), and driven over loopback HTTP with the Python client.
2. Each of ``--iterations`` boots runs a randomized workload against ``--sessions``
   sessions (created on the first boot): prompts with and without ids, steer and queue
   deliveries, synthetic input, exact retries of an id (same payload, a different payload,
   and two copies of one request concurrently), interrupts (with and without resume), and
   scripted tool calls (``#tool bash``) that append to a side-effect ledger. Then the
   server is killed with SIGKILL at a moment chosen by the boot's *kill mode*:

   * ``group-commit``: a burst of 40-120 concurrent admissions is fired and the server is
     killed when the k-th receipt (k random, at most a third of the burst) arrives, i.e.
     while most of the burst is in flight inside the store's group commit;
   * ``mid-tool``: 1-3 tool prompts are sent and the server is killed 0-350 ms after the
     first ``session.tool.called`` of this boot shows up on the instance feed
     (``GET /api/event``): before, during or after the bash command's side effect;
   * ``random``: killed 0.3-1.5 s into the workload;
   * ``startup``: no workload; killed 70-110 % of the previous boot's start-up time after
     spawn, so late in start-up (the recovery sweep) or in the executions it resumed;
   * ``mid-ask``: 1-2 prompts whose tool calls ask for permission are sent and the server
     is killed while a call waits for its answer: at once, or 0-50 ms after an answer
     was sent (so before, while or after the reply commits);
   * ``mid-revert``: the server is spawned with the revert test hook
     (``actors.session.revert.PAUSE_ENV``) set at a point chosen at random (an intent durable
     before its event, an event committed before any file, one path restored of several,
     a commit's events committed), a stage, clear or commit of the git session's files
     revert is made to reach it, and the server is killed while it waits there. The next
     boot checks the files against the log (:func:`check_revert_files`) as soon as it
     listens, before any workload can write them.
   * ``symlink-revert``: as ``mid-revert``, on a fresh git tree whose bash steps swap a
     symlink ``d`` (to a sibling directory or to the data dir, each holding a canary)
     for a real directory written through, and a files revert of the swap is made to
     reach the hook's point (``scripts/_crashsim_swaps.py``). After every restart and at
     the end: the canaries and the database are intact and each swap tree is what its
     log says.

   Sessions run under the agent ``crashsim`` (``DIR/data/agents.toml``), whose bash rule
   asks for any command line holding a simple command ``true ASK <marker>`` and allows
   the rest (an ``always`` answer allows just that call's command again).
   About a third of the tool calls carry it. An answerer polls
   ``GET /api/session/{id}/permission`` in every boot (the final one too) and answers
   each request after a random pause, at random ``once``, ``always`` or ``reject``.

   Every boot after the first begins by retrying, exactly (same id, same payload), every
   request with an id whose outcome the kill left unknown.
3. A final boot settles everything: it retries the unknown requests, waits until
   ``GET /api/session/active`` is empty and ``POST /api/experimental/session/{id}/wait``
   has answered for every session, checks the API's view of every admission, and stops
   the server with SIGTERM (graceful). The database is then opened read-only.

Every tool call runs ``echo "S <marker> $PPID <ms>" >> LEDGER; sleep <s>;
echo "D <marker> $PPID <ms>" >> LEDGER`` with a marker unique to that call, so each side
effect is attributed to the ``session.tool.called`` event carrying the marker, and to the
server process that ran it (bash's ``$PPID`` is the server's pid; the bash tool starts the
command directly).

Checks (:func:`check_database`, importable; each finding is a :class:`Violation`):

(a) admissions: every admission the client got a receipt for has exactly one
    ``session.inbox.enqueued`` (the workload never cancels) matching the receipt
    (session, type, payload, time); at most one ``session.inbox.delivered``; it is pending
    (``session_inbox``) when undelivered and in ``session_message`` when delivered; every
    receipt for one id is the same receipt;
(b) per-session ``seq`` runs 1..n with no gap or duplicate;
(c) tool calls: at most one terminal per (session, assistantMessageID, call id); every
    marker's start line appears at most once in the ledger (nothing ran twice, an aborted
    call was never replayed); a start line belongs to a durable ``session.tool.called``;
    it was written by the process that recorded that call, never by a later boot; a call
    failed ``aborted`` has no start line later than its failure; after the settle no call
    or tool part is left open;
(d) claims: ``time_claimed`` is NULL or ``resume_attempts`` within the bound (the
    server's default, ``actors.recovery.DEFAULT_MAX_ATTEMPTS``); after the settle, NULL;
(e) ``storage.rebuild.rebuild_projections``: stored projections == rebuilt;
(f) user shells: each ended at most once (once after the settle), its notice enqueued
    with the end (id = shell id + ``n``), never twice; none left running after the settle;
(g) reverts: the stored staged revert is the last revert event's; a commit left no
    transcript row at or after its boundary but a user shell running at the commit; after
    the settle no revert intent is left in ``<data>/revert`` (recovery finished or dropped
    each one a crash interrupted), not even a torn ``.tmp``; and the files agree with the
    log (:func:`check_revert_files`): each file the last revert restored is byte for byte
    as in the tree it was restored from, unless a later write call names it.
(h) permissions (:func:`check_permissions`): no call runs unasked: a marker whose call
    carries ``true ASK`` has a start line only if its ``session.permission.asked`` has a
    ``once``/``always`` reply committed before the line was written, or an earlier
    ``always`` reply in its session has a pattern matching the call's asked command; a
    rejected call never runs and never succeeds; a request has at most one reply, and
    every reply follows its request; each asked call settles exactly once (checked by
    (c)); after the settle no request is left pending.

Plus the API (final boot): every receipt is pending in ``inbox`` or delivered in
``messages``, and nothing is left active. A server that fails to start after a crash is a
violation too.

Time to recover, per restart, is measured two ways: *sweep done* is from spawning the
process to its ``listening`` line; the startup sweep (``session.execution.recovering`` and
the restart notice admitted for every claimed session) runs inside app start-up, before the
server binds, so this is "until every notice is admitted". *Resumed* is from spawning to the
last recovered session's ``session.execution.started`` after its ``recovering``, from the
events' ``created`` timestamps (same clock); ``-`` when the boot was killed before all had
resumed. ``GET /api/session/active`` is not used for it: a resumed session can finish before
any poll sees it.

``--seed`` makes every choice reproducible (the workload, the schedule, ids and markers come
from ``random.Random`` instances derived from the seed); timing, and so what a kill
interrupts, still varies. The exit status is 1 on any violation, 2 when the harness itself
fails. Every wait has a timeout, and the server is killed on any exit.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import itertools
import json
import os
import random
import re
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import types
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from _children import die_with_parent

from actors.recovery import DEFAULT_MAX_ATTEMPTS
from actors.session.revert import PAUSE_ENV, PAUSE_POINTS
from actors.tools._permission import matches
from actors.tools._shell_grammar import bash_subjects
from protocol.client import Client, ClientError
from protocol.errors import DomainError
from protocol.operations import (
    InterruptQuery,
    MessagesQuery,
    PermissionReplyInput,
    RevertStageInput,
    ShellInput,
)
from protocol.requests import CreateSessionInput, PromptInput, SyntheticInput
from protocol.shapes import Delivery, InboxItem, Location
from storage.rebuild import rebuild_projections

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _crashsim_swaps import Swaps

__all__ = [
    "Boot",
    "Receipt",
    "Violation",
    "check_admissions",
    "check_claims",
    "check_database",
    "check_permissions",
    "check_rebuild",
    "check_revert_files",
    "check_reverts",
    "check_sequences",
    "check_shells",
    "check_tools",
    "main",
    "read_ledger",
    "recovery_timeline",
]

DB_NAME: Final = "sessionrt.sqlite"
#: What the symlink-revert mode builds its requests from.
_INPUTS: Final = types.SimpleNamespace(
    CreateSessionInput=CreateSessionInput,
    Location=Location,
    PromptInput=PromptInput,
    RevertStageInput=RevertStageInput,
)
KILL_MODES: Final = (
    "mid-tool",
    "group-commit",
    "random",
    "startup",
    "mid-ask",
    "mid-revert",
    "symlink-revert",
)
AGENT: Final = "crashsim"
#: The simple command that makes a tool call ask (see the module docstring).
ASK: Final = "true ASK"
AGENTS_TOML: Final = f"""
[agents.{AGENT}.permissions]
bash = {{ "*" = "allow", "{ASK} *" = "ask" }}
"""
MARKER: Final = re.compile(r"\bCSM_[0-9A-Za-z_]+")
START_TIMEOUT_S: Final = 30.0
SETTLE_TIMEOUT_S: Final = 40.0
REQUEST_TIMEOUT_S: Final = 15.0
WORKERS: Final = 4

# -- what the checks work on -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Violation:
    check: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.check}] {self.detail}"


@dataclasses.dataclass(frozen=True)
class Receipt:
    """An admission receipt the client got back (first admissions and retries alike)."""

    session_id: str
    inbox_id: str
    type: str
    delivery: str
    time_created: int
    payload: Mapping[str, Any]
    retry: bool = False

    @classmethod
    def of(cls, item: InboxItem, *, retry: bool = False) -> Receipt:
        return cls(
            session_id=item.session_id,
            inbox_id=item.id,
            type=item.type,
            delivery=item.delivery,
            time_created=item.time_created,
            payload=dict(item.payload),
            retry=retry,
        )

    def key(self) -> tuple[Any, ...]:
        return (
            self.session_id,
            self.type,
            self.delivery,
            self.time_created,
            json.dumps(self.payload, sort_keys=True),
        )


@dataclasses.dataclass
class Boot:
    """One server process: when it started (wall ms, same clock as events) and its pid."""

    index: int
    pid: int
    spawn_ms: int
    mode: str = "final"
    listening_s: float | None = None
    killed: bool = False
    kill_after_s: float | None = None
    in_flight_at_kill: int | None = None
    exit_code: int | None = None
    note: str = ""


@dataclasses.dataclass(frozen=True)
class LedgerLine:
    kind: str  # "S" (started) or "D" (done)
    marker: str
    ppid: int
    ms: int


@dataclasses.dataclass(frozen=True)
class Event:
    position: int
    aggregate_id: str
    seq: int
    type: str  # without the version suffix
    created: int
    data: Mapping[str, Any]


def _open_ro(path: str | Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)


def load_events(conn: sqlite3.Connection) -> list[Event]:
    rows = conn.execute(
        "SELECT position, aggregate_id, seq, type, created, data FROM event ORDER BY position"
    )
    return [
        Event(
            position=r[0],
            aggregate_id=r[1],
            seq=r[2],
            type=r[3].rsplit(".", 1)[0],
            created=r[4],
            data=json.loads(r[5]),
        )
        for r in rows
    ]


def read_ledger(path: str | Path) -> tuple[list[LedgerLine], list[Violation]]:
    lines: list[LedgerLine] = []
    bad: list[Violation] = []
    try:
        text = Path(path).read_text(errors="replace")
    except FileNotFoundError:
        return lines, bad
    for n, raw in enumerate(text.splitlines(), 1):
        parts = raw.split()
        if len(parts) != 4 or parts[0] not in ("S", "D") or not MARKER.fullmatch(parts[1]):
            bad.append(Violation("ledger.malformed", f"line {n}: {raw!r}"))
            continue
        try:
            lines.append(LedgerLine(parts[0], parts[1], int(parts[2]), int(parts[3])))
        except ValueError:
            bad.append(Violation("ledger.malformed", f"line {n}: {raw!r}"))
    return lines, bad


def _boot_at(boots: Sequence[Boot], ms: int) -> Boot | None:
    found = None
    for boot in boots:
        if boot.spawn_ms <= ms:
            found = boot
    return found


def _short(value: object, limit: int = 200) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- the checks --------------------------------------------------------------------------------


def check_admissions(
    conn: sqlite3.Connection, events: Sequence[Event], receipts: Iterable[Receipt]
) -> list[Violation]:
    """(a) every receipt: enqueued once, delivered at most once, pending xor delivered."""
    out: list[Violation] = []
    enqueued: dict[str, list[Event]] = collections.defaultdict(list)
    delivered: collections.Counter[str] = collections.Counter()
    cancelled: collections.Counter[str] = collections.Counter()
    for e in events:
        if e.type == "session.inbox.enqueued":
            enqueued[e.data["inboxID"]].append(e)
        elif e.type == "session.inbox.delivered":
            delivered[e.data["inboxID"]] += 1
        elif e.type == "session.inbox.cancelled":
            cancelled[e.data["inboxID"]] += 1
    pending = dict(conn.execute("SELECT id, session_id FROM session_inbox").fetchall())
    messages = dict(conn.execute("SELECT id, session_id FROM session_message").fetchall())
    for inbox_id, count in delivered.items():
        if count > 1:
            out.append(
                Violation("admission.delivered-twice", f"{inbox_id}: {count} inbox.delivered")
            )
    by_id: dict[str, list[Receipt]] = collections.defaultdict(list)
    for receipt in receipts:
        by_id[receipt.inbox_id].append(receipt)
    for inbox_id, group in by_id.items():
        first = group[0]
        where = f"{inbox_id} (session {first.session_id}, {first.type})"
        for other in group[1:]:
            if other.key() != first.key():
                out.append(
                    Violation(
                        "receipt.mismatch",
                        f"{where}: receipts differ: {_short(first.key())} vs {_short(other.key())}",
                    )
                )
        found = enqueued.get(inbox_id, [])
        if not found:
            out.append(Violation("admission.lost", f"{where}: receipt but no inbox.enqueued"))
            continue
        if len(found) > 1 + cancelled[inbox_id]:
            out.append(
                Violation(
                    "admission.duplicated",
                    f"{where}: {len(found)} inbox.enqueued (seqs "
                    f"{[e.seq for e in found]}), {cancelled[inbox_id]} cancelled",
                )
            )
        e = found[0]
        item = e.data.get("item", {})
        stored = (e.aggregate_id, item.get("type"), item.get("delivery"), e.created)
        expected = (first.session_id, first.type, first.delivery, first.time_created)
        if stored != expected or item.get("payload") != first.payload:
            out.append(
                Violation(
                    "admission.mismatch",
                    f"{where}: enqueued {_short([*stored, item.get('payload')])} "
                    f"vs receipt {_short([*expected, first.payload])}",
                )
            )
        if cancelled[inbox_id]:
            continue  # a cancel (+ readmit) makes the final state a matter of order
        if delivered[inbox_id]:
            if inbox_id not in messages or inbox_id in pending:
                out.append(
                    Violation(
                        "admission.projection",
                        f"{where}: delivered but in_messages={inbox_id in messages} "
                        f"in_inbox={inbox_id in pending}",
                    )
                )
        elif inbox_id not in pending or inbox_id in messages:
            out.append(
                Violation(
                    "admission.projection",
                    f"{where}: undelivered but in_inbox={inbox_id in pending} "
                    f"in_messages={inbox_id in messages}",
                )
            )
    return out


def check_sequences(events: Sequence[Event]) -> list[Violation]:
    """(b) each aggregate's seqs are exactly 1..n."""
    seqs: dict[str, list[int]] = collections.defaultdict(list)
    for e in events:
        seqs[e.aggregate_id].append(e.seq)
    out: list[Violation] = []
    for aggregate, found in seqs.items():
        ordered = sorted(found)
        if ordered != list(range(1, len(ordered) + 1)):
            dups = sorted(s for s, n in collections.Counter(ordered).items() if n > 1)
            missing = sorted(set(range(1, max(ordered) + 1)) - set(ordered))
            out.append(
                Violation(
                    "seq.not-contiguous",
                    f"{aggregate}: {len(ordered)} events, max seq {max(ordered)}, "
                    f"duplicates {dups[:10]}, missing {missing[:10]}",
                )
            )
    return out


CallKey = tuple[str, str, str]


def check_tools(
    conn: sqlite3.Connection,
    events: Sequence[Event],
    ledger: Sequence[LedgerLine],
    boots: Sequence[Boot] = (),
    *,
    settled: bool = True,
) -> list[Violation]:
    """(c) one terminal per call; every side effect once, by its caller, never after an abort."""
    out: list[Violation] = []
    called: dict[CallKey, Event] = {}
    terminals: dict[CallKey, list[Event]] = collections.defaultdict(list)
    marker_calls: dict[str, list[CallKey]] = collections.defaultdict(list)
    for e in events:
        if e.type not in ("session.tool.called", "session.tool.success", "session.tool.failed"):
            continue
        key = (e.aggregate_id, e.data["assistantMessageID"], e.data["id"])
        if e.type == "session.tool.called":
            if key in called:
                out.append(
                    Violation("tool.called-twice", f"{key}: seqs {called[key].seq}, {e.seq}")
                )
            called[key] = e
            command = str(e.data.get("input", {}).get("command", ""))
            for marker in set(MARKER.findall(command)):
                marker_calls[marker].append(key)
        else:
            terminals[key].append(e)
    for key, ends in terminals.items():
        if len(ends) > 1:
            kinds = [f"{t.type.rsplit('.', 1)[1]}@{t.seq}" for t in ends]
            out.append(Violation("tool.terminals", f"{key}: {len(ends)} terminals {kinds}"))
    starts: dict[str, list[LedgerLine]] = collections.defaultdict(list)
    for line in ledger:
        if line.kind == "S":
            starts[line.marker].append(line)
    pids = {boot.pid: boot for boot in boots}
    for marker, lines in starts.items():
        keys = marker_calls.get(marker, [])
        if len(lines) > 1:
            out.append(
                Violation(
                    "tool.executed-twice",
                    f"{marker}: {len(lines)} start lines (pids "
                    f"{[line.ppid for line in lines]}), carried by calls {keys}",
                )
            )
        if not keys:
            out.append(
                Violation(
                    "tool.undurable", f"{marker}: a side effect without a durable tool.called"
                )
            )
            continue
        if len(keys) != 1:
            continue  # attribution is ambiguous; executed-twice (if so) said it
        key = keys[0]
        call = called[key]
        line = lines[0]
        if boots:
            caller = _boot_at(boots, call.created)
            runner = pids.get(line.ppid)
            if caller is not None and runner is not None and runner.index != caller.index:
                out.append(
                    Violation(
                        "tool.wrong-process",
                        f"{marker} {key}: called by boot {caller.index} (pid {caller.pid}) "
                        f"but run by boot {runner.index} (pid {runner.pid})",
                    )
                )
        for end in terminals.get(key, []):
            error = end.data.get("error") or {}
            aborted = end.type == "session.tool.failed" and error.get("type") == "aborted"
            if aborted and line.ms > end.created:
                out.append(
                    Violation(
                        "tool.after-abort",
                        f"{marker} {key}: started at {line.ms}, after the call was failed "
                        f"aborted at {end.created} (seq {end.seq})",
                    )
                )
    if settled:
        for key, call in called.items():
            if not terminals.get(key):
                out.append(
                    Violation("tool.unsettled", f"{key}: tool.called (seq {call.seq}), no terminal")
                )
        for row in conn.execute(
            "SELECT session_id, message_id, key, status FROM session_part"
            " WHERE status IN ('streaming', 'running')"
        ):
            out.append(Violation("tool.part-open", f"part {tuple(row)} still open after settle"))
    return out


def check_permissions(
    conn: sqlite3.Connection,
    events: Sequence[Event],
    ledger: Sequence[LedgerLine],
    *,
    settled: bool = True,
) -> list[Violation]:
    """(h) nothing asked runs without an allowing answer; one answer per request."""
    out: list[Violation] = []
    asked: dict[str, Event] = {}
    asks_of: dict[CallKey, list[Event]] = collections.defaultdict(list)
    replies: dict[str, list[Event]] = collections.defaultdict(list)
    calls: dict[str, CallKey] = {}
    commands: dict[CallKey, str] = {}
    ask_calls: set[CallKey] = set()
    terminals: dict[CallKey, list[Event]] = collections.defaultdict(list)
    for e in events:
        if e.type == "session.permission.asked":
            asked[e.data["id"]] = e
            key = (e.aggregate_id, e.data["assistantMessageID"], e.data["callID"])
            asks_of[key].append(e)
        elif e.type == "session.permission.replied":
            if e.data["id"] not in asked:
                out.append(Violation("permission.reply-without-ask", f"{e.data} (seq {e.seq})"))
            replies[e.data["id"]].append(e)
        elif e.type == "session.tool.called":
            key = (e.aggregate_id, e.data["assistantMessageID"], e.data["id"])
            command = str(e.data.get("input", {}).get("command", ""))
            commands[key] = command
            if ASK in command:
                ask_calls.add(key)
            for marker in set(MARKER.findall(command)):
                calls[marker] = key
        elif e.type in ("session.tool.success", "session.tool.failed"):
            terminals[(e.aggregate_id, e.data["assistantMessageID"], e.data["id"])].append(e)
    for pid, answers in replies.items():
        if len(answers) > 1:
            out.append(Violation("permission.replied-twice", f"{pid}: {len(answers)} replies"))
    starts = {line.marker: line for line in ledger if line.kind == "S"}
    for marker, line in starts.items():
        key = calls.get(marker)
        if key is None or key not in ask_calls:
            continue
        allowed = [
            r
            for a in asks_of.get(key, [])
            for r in replies.get(a.data["id"], [])
            if r.data["reply"] in ("once", "always")
        ]
        if not asks_of.get(key):
            command = commands[key]
            granted = any(
                r.data["reply"] == "always"
                and r.aggregate_id == key[0]
                and r.created <= line.ms
                and any(
                    matches(pattern, simple)
                    for pattern in asked[pid].data.get("always", ())
                    for simple in bash_subjects(command).commands
                    if simple.startswith(ASK)
                )
                for pid, answers in replies.items()
                if pid in asked
                for r in answers
            )
            if not granted:
                out.append(Violation("permission.ran-unasked", f"{marker} {key}: never asked, ran"))
        elif not allowed:
            out.append(Violation("permission.ran-unallowed", f"{marker} {key}: no allowing reply"))
        elif line.ms < min(r.created for r in allowed):
            out.append(
                Violation("permission.ran-before-answer", f"{marker} {key}: ran at {line.ms}")
            )
    for key, asks in asks_of.items():
        rejected = any(
            r.data["reply"] == "reject" for a in asks for r in replies.get(a.data["id"], [])
        )
        if rejected and any(t.type == "session.tool.success" for t in terminals.get(key, [])):
            out.append(Violation("permission.rejected-succeeded", f"{key}"))
    if settled:
        for row in conn.execute(
            "SELECT id, session_id FROM session_permission WHERE status = 'pending'"
        ):
            out.append(Violation("permission.pending-after-settle", f"{tuple(row)}"))
    return out


def check_claims(
    conn: sqlite3.Connection, *, max_attempts: int = DEFAULT_MAX_ATTEMPTS, settled: bool = True
) -> list[Violation]:
    """(d) a claim is released or within its attempt bound; released by all after a settle."""
    out: list[Violation] = []
    rows = conn.execute(
        "SELECT id, time_claimed, resume_attempts FROM session WHERE time_claimed IS NOT NULL"
    )
    for session_id, claimed, attempts in rows:
        if attempts > max_attempts:
            out.append(
                Violation(
                    "claim.unbounded",
                    f"{session_id}: claimed since {claimed}, {attempts} resume attempts "
                    f"> bound {max_attempts}",
                )
            )
        elif settled:
            out.append(
                Violation(
                    "claim.unreleased",
                    f"{session_id}: still claimed (since {claimed}, {attempts} attempts) "
                    "after the settle",
                )
            )
    return out


def check_fences(conn: sqlite3.Connection) -> list[Violation]:
    """(i) no two hosts wrote one session under overlapping lease epochs.

    Along a session's log, the epoch of its fenced events never goes down (a
    write under an epoch after a higher one was written means a host that had
    lost its lease still wrote), and each epoch belongs to one host.
    """
    rows = conn.execute(
        "SELECT session_id, position, host_id, epoch FROM event_fence ORDER BY session_id, position"
    )
    return fences_violations(rows)


def fences_violations(rows: Iterable[Sequence[Any]]) -> list[Violation]:
    """:func:`check_fences` over ``(session, position, host, epoch)`` rows in that order."""
    out: list[Violation] = []
    last: dict[str, tuple[int, int]] = {}
    owner: dict[tuple[str, int], str] = {}
    for session_id, position, host, epoch in rows:
        seen = owner.setdefault((session_id, epoch), host)
        if seen != host:
            out.append(
                Violation(
                    "fence.shared-epoch",
                    f"{session_id}: epoch {epoch} written by {seen} and {host}"
                    f" (position {position})",
                )
            )
        before = last.get(session_id)
        if before is not None and epoch < before[1]:
            out.append(
                Violation(
                    "fence.overlap",
                    f"{session_id}: position {position} written under epoch {epoch} by {host}"
                    f" after epoch {before[1]} wrote position {before[0]}",
                )
            )
        last[session_id] = (position, max(epoch, before[1] if before else epoch))
    return out


def check_shells(
    conn: sqlite3.Connection, events: Sequence[Event], *, settled: bool = True
) -> list[Violation]:
    """(f) user shells: ended at most once (once after the settle), one notice each.

    The notice's id is the shell id plus ``n`` (``actors.session.shells.notice_id``); it is
    enqueued in the same transaction as the end, so an end without its notice, a
    notice without an end, or two of either is a violation; a ``cancelled`` end
    (recovery at start) never comes from the process that started the shell.
    """
    out: list[Violation] = []
    started: dict[str, Event] = {}
    ended: dict[str, list[Event]] = collections.defaultdict(list)
    notices: collections.Counter[str] = collections.Counter()
    for e in events:
        if e.type == "session.shell.started":
            started[e.data["shell"]["id"]] = e
        elif e.type == "session.shell.ended":
            ended[e.data["shell"]["id"]].append(e)
        elif e.type == "session.inbox.enqueued":
            meta = e.data.get("item", {}).get("payload", {}).get("metadata") or {}
            if meta.get("source") == "shell":
                notices[e.data["inboxID"]] += 1
    for shell_id, start in started.items():
        ends = ended.get(shell_id, [])
        if len(ends) > 1:
            out.append(Violation("shell.ended-twice", f"{shell_id}: {len(ends)} shell.ended"))
        if settled and not ends:
            out.append(Violation("shell.never-ended", f"{shell_id}: still running after settle"))
        if notices[f"{shell_id}n"] != len(ends[:1]):
            out.append(
                Violation(
                    "shell.notice",
                    f"{shell_id}: {len(ends)} ends, {notices[f'{shell_id}n']} notices",
                )
            )
        if (
            ends
            and ends[0].data["shell"]["state"] == "cancelled"
            and ends[0].created < start.created
        ):
            out.append(Violation("shell.order", f"{shell_id}: cancelled before it started"))
    running = conn.execute(
        "SELECT id FROM session_message WHERE type = 'shell'"
        " AND json_extract(data, '$.shell.state') = 'running'"
    ).fetchall()
    if settled and running:
        out.append(Violation("shell.projection", f"running after settle: {running[:5]}"))
    for shell_id in ended:
        if shell_id not in started:
            out.append(Violation("shell.orphan-end", f"{shell_id}: ended, never started"))
    return out


def check_reverts(conn: sqlite3.Connection, events: Sequence[Event]) -> list[Violation]:
    """(g) reverts: the session's staged revert is the last revert event's, and a
    committed revert left no transcript row at or after its boundary that predates it."""
    out: list[Violation] = []
    last: dict[str, Event] = {}
    boundary: dict[str, tuple[int, int]] = {}  # session -> (boundary seq, commit seq)
    seq_of: dict[tuple[str, str], int] = {}
    for e in events:
        if e.type in ("session.inbox.delivered",):
            seq_of[(e.aggregate_id, e.data["inboxID"])] = e.seq
        elif e.type in ("session.revert.staged", "session.revert.cleared"):
            last[e.aggregate_id] = e
        elif e.type == "session.revert.committed":
            last[e.aggregate_id] = e
            at = seq_of.get((e.aggregate_id, e.data["to"]))
            if at is not None:
                boundary[e.aggregate_id] = (at, e.seq)
    for sid, e in last.items():
        row = conn.execute("SELECT revert FROM session WHERE id = ?", (sid,)).fetchone()
        if row is None:
            continue
        staged = json.loads(row[0]) if row[0] else None
        want = e.data["revert"] if e.type == "session.revert.staged" else None
        if staged != want:
            out.append(Violation("revert.state", f"{sid}: stored {staged} after {e.type}"))
    # A user shell running at the commit stays (a revert cannot undo live work).
    shell_ended = {e.data["shell"]["id"]: e.seq for e in events if e.type == "session.shell.ended"}
    for sid, (at, commit) in boundary.items():
        rows = conn.execute(
            "SELECT id, type FROM session_message WHERE session_id = ? AND seq >= ? AND seq < ?",
            (sid, at, commit),
        ).fetchall()
        left = [
            (i,)
            for i, kind in rows
            if not (kind == "shell" and shell_ended.get(i, commit + 1) > commit)
        ]
        if left:
            out.append(Violation("revert.leftover", f"{sid}: {left[:5]} survived the commit"))
    return out


#: Tool calls that change files: a path one of them named after a revert is its, not the revert's.
_WRITERS: Final = frozenset({"write", "edit"})


def check_revert_files(
    conn: sqlite3.Connection, events: Sequence[Event], snapshots: Path
) -> list[Violation]:
    """(g) files, after the settle: each file the session's last revert restored is as
    it left it, byte for byte, unless a later write call names it.

    Staged (or then committed): as in the ``before`` tree of the first writing step
    after the boundary that changed it; cleared: as in the tree the revert recorded at
    staging. A bash call after the revert could change anything: its session is
    skipped. Trees are read with the ``git`` program from the stores in ``snapshots``.
    """
    out: list[Violation] = []
    last: dict[str, Event] = {}
    staged: dict[str, Event] = {}
    for e in events:
        if e.type == "session.revert.staged":
            last[e.aggregate_id] = staged[e.aggregate_id] = e
        elif e.type == "session.revert.cleared":
            last[e.aggregate_id] = e
    for sid, e in last.items():
        revert = staged[sid].data["revert"] if sid in staged else {}
        files = revert.get("files") or []
        if not files:
            continue
        later = [
            x
            for x in events
            if x.aggregate_id == sid and x.seq > e.seq and x.type == "session.tool.called"
        ]
        if any(x.data.get("name") not in _WRITERS for x in later):
            continue
        touched = {str(x.data.get("input", {}).get("path", "")) for x in later}
        row = conn.execute("SELECT directory FROM session WHERE id = ?", (sid,)).fetchone()
        if row is None:
            continue
        if e.type == "session.revert.cleared":
            trees = dict.fromkeys(files, revert.get("snapshot"))
        else:
            trees = _first_before(events, sid, revert["messageID"], e.seq)
        for path in files:
            tree = trees.get(path)
            if path in touched or tree is None:
                continue
            want = _blob(snapshots, tree, path)
            have = _inside_bytes(Path(row[0]), path)
            if have != want:
                out.append(
                    Violation(
                        "revert.files",
                        f"{sid}: {path} is {_short(have, 60)} after {e.type} "
                        f"(seq {e.seq}), not {_short(want, 60)}",
                    )
                )
    return out


def _inside_bytes(base: Path, rel: str) -> bytes | None:
    """What ``rel`` is inside ``base`` as git stores it: a file's bytes, a symlink's
    target; None if it is missing, a directory, or under a symlink (then it is not
    inside ``base`` at all)."""
    path = base
    parts = rel.split("/")
    for part in parts[:-1]:
        path = path / part
        if path.is_symlink() or not path.is_dir():
            return None
    path = path / parts[-1]
    if path.is_symlink():
        return os.fsencode(os.readlink(path))
    try:
        return path.read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def _swaps_line(swaps: Mapping[str, Any]) -> str:
    kills = ", ".join(f"{k} {v}" for k, v in sorted(swaps["kills"].items())) or "none"
    return f"{swaps['swaps']} trees swapped, {swaps['reverts']} reverts staged; kills: {kills}"


def _first_before(events: Sequence[Event], sid: str, message_id: str, until: int) -> dict[str, str]:
    """Per path: the tree before the first writing step after ``message_id`` that changed it.

    The message's position is its delivery's seq (a committed revert removed its row).
    """
    at = next(
        (
            e.seq
            for e in events
            if e.aggregate_id == sid
            and e.type == "session.inbox.delivered"
            and e.data.get("inboxID") == message_id
        ),
        None,
    )
    if at is None:
        return {}
    out: dict[str, str] = {}
    started: str | None = None
    for e in events:
        if e.aggregate_id != sid or not at <= e.seq < until:
            continue
        if e.type == "session.step.started":
            started = e.data.get("snapshot")
        elif e.type in ("session.step.ended", "session.step.failed") and e.data.get("snapshot"):
            before = e.data.get("before") or started
            started = None
            for path in e.data.get("files") or ():
                if before is not None:
                    out.setdefault(path, before)
    return out


def _blob(snapshots: Path, tree: str, path: str) -> bytes | None:
    """``path`` in ``tree`` of whichever store in ``snapshots`` has it; None if absent."""
    for store in sorted(snapshots.iterdir()) if snapshots.is_dir() else ():
        git = ["git", "--git-dir", str(store)]
        if subprocess.run(
            [*git, "cat-file", "-e", f"{tree}^{{tree}}"], capture_output=True
        ).returncode:
            continue
        found = subprocess.run(
            [*git, "ls-tree", "-z", tree, "--", path], capture_output=True
        ).stdout
        if not found or b" blob " not in found.split(b"\t", 1)[0]:
            return None  # absent, or a directory there (its files are entries of their own)
        return subprocess.run(
            [*git, "cat-file", "blob", f"{tree}:{path}"], capture_output=True, check=True
        ).stdout
    return None


def check_rebuild(path: str | Path) -> list[Violation]:
    """(e) replaying the log gives the stored projections."""
    try:
        stored, rebuilt = rebuild_projections(str(path))
    except Exception as exc:
        return [Violation("rebuild.failed", f"{type(exc).__name__}: {exc}")]
    out: list[Violation] = []
    for table in stored:
        a = collections.Counter(stored[table])
        b = collections.Counter(rebuilt.get(table, []))
        if a != b:
            only_stored = list((a - b).elements())
            only_rebuilt = list((b - a).elements())
            out.append(
                Violation(
                    "rebuild.mismatch",
                    f"{table}: {len(only_stored)} rows only stored, {len(only_rebuilt)} only "
                    f"rebuilt; e.g. stored {_short(only_stored[:2], 400)} "
                    f"rebuilt {_short(only_rebuilt[:2], 400)}",
                )
            )
    return out


def check_database(
    path: str | Path,
    receipts: Iterable[Receipt],
    ledger: str | Path,
    boots: Sequence[Boot] = (),
    *,
    settled: bool = True,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
) -> list[Violation]:
    """Every database check, (a) to (h), on the database file at ``path`` (read-only)."""
    lines, out = read_ledger(ledger)
    conn = _open_ro(path)
    try:
        conn.execute("BEGIN")
        events = load_events(conn)
        out += check_admissions(conn, events, receipts)
        out += check_sequences(events)
        out += check_tools(conn, events, lines, boots, settled=settled)
        out += check_permissions(conn, events, lines, settled=settled)
        out += check_claims(conn, max_attempts=max_attempts, settled=settled)
        out += check_fences(conn)
        out += check_shells(conn, events, settled=settled)
        out += check_reverts(conn, events)
        if settled:
            out += revert_leftovers(Path(path).parent, conn, events, "after the settle")
        conn.execute("COMMIT")
    finally:
        conn.close()
    out += check_rebuild(path)
    return out


def revert_leftovers(
    data_dir: Path, conn: sqlite3.Connection, events: Sequence[Event], when: str
) -> list[Violation]:
    """Files that disagree with the last revert, and intents left in ``data_dir``.

    A torn intent (``.tmp``, killed while written) is left over too.
    """
    out = check_revert_files(conn, events, data_dir / "snapshot")
    left = sorted((data_dir / "revert").glob("*"))
    return out + [Violation("revert.intent-left", f"{i.name} {when}") for i in left]


def recovery_timeline(
    path: str | Path, boots: Sequence[Boot], *, max_attempts: int = DEFAULT_MAX_ATTEMPTS
) -> list[dict[str, Any]]:
    """Per boot: the sessions its sweep recovered and when the last of them resumed."""
    conn = _open_ro(path)
    try:
        events = load_events(conn)
    finally:
        conn.close()
    out = []
    for i, boot in enumerate(boots):
        end = boots[i + 1].spawn_ms if i + 1 < len(boots) else None
        window = [
            e for e in events if e.created >= boot.spawn_ms and (end is None or e.created < end)
        ]
        recovering = {e.aggregate_id: e for e in window if e.type == "session.execution.recovering"}
        exhausted = {s for s, e in recovering.items() if e.data.get("attempt", 0) > max_attempts}
        resumed: dict[str, int] = {}
        notices = 0
        for e in window:
            rec = recovering.get(e.aggregate_id)
            if rec is None or e.position <= rec.position:
                continue
            if e.type == "session.execution.started" and e.aggregate_id not in resumed:
                resumed[e.aggregate_id] = e.created
            elif e.type == "session.inbox.enqueued":
                metadata = e.data.get("item", {}).get("payload", {}).get("metadata") or {}
                notices += metadata.get("notice") == "restart"
        todo = set(recovering) - exhausted
        all_resumed = bool(todo) and todo <= set(resumed)
        last = max((resumed[s] for s in todo), default=0) if all_resumed else 0
        out.append(
            {
                "boot": boot.index,
                "recovered": len(recovering),
                "exhausted": len(exhausted),
                "notices": notices,
                "resumed": len(todo & set(resumed)),
                "sweep_done_s": boot.listening_s,
                "resumed_s": round((last - boot.spawn_ms) / 1000, 3) if all_resumed else None,
            }
        )
    return out


def tool_summary(
    path: str | Path, ledger: Sequence[LedgerLine], boots: Sequence[Boot]
) -> dict[str, int]:
    """Counts for the report: stale fails (a later boot failed the call), pid attribution."""
    conn = _open_ro(path)
    try:
        events = load_events(conn)
    finally:
        conn.close()
    origin: dict[CallKey, Event] = {}
    marker_of: dict[CallKey, str] = {}
    stale = stale_with_effect = 0
    started = {line.marker for line in ledger if line.kind == "S"}
    for e in events:
        if not e.type.startswith("session.tool."):
            continue
        key = (e.aggregate_id, e.data.get("assistantMessageID", ""), e.data.get("id", ""))
        if e.type == "session.tool.input.started":
            origin.setdefault(key, e)
        elif e.type == "session.tool.called":
            origin.setdefault(key, e)
            found = MARKER.findall(str(e.data.get("input", {}).get("command", "")))
            if found:
                marker_of[key] = found[0]
        elif e.type == "session.tool.failed" and key in origin:
            first, failing = _boot_at(boots, origin[key].created), _boot_at(boots, e.created)
            if first is not None and failing is not None and first.index != failing.index:
                stale += 1
                stale_with_effect += marker_of.get(key) in started
    pids = {boot.pid for boot in boots}
    return {
        "stale_failed": stale,
        "stale_failed_after_side_effect": stale_with_effect,
        "ledger_lines_by_a_known_server_pid": sum(line.ppid in pids for line in ledger),
    }


# -- the server process ------------------------------------------------------------------------


class Server:
    """One ``sessionrt serve`` subprocess; stdout is read by a thread for the listening line."""

    live: Final[set[subprocess.Popen[bytes]]] = set()

    def __init__(
        self,
        exe: Path,
        data_dir: Path,
        cwd: Path,
        log: Path,
        index: int,
        env: Mapping[str, str] | None = None,
    ) -> None:
        hidden = ("SESSIONRT_SERVER_PASSWORD", PAUSE_ENV)
        env = {
            **{k: v for k, v in os.environ.items() if k not in hidden},
            **(env or {}),
        }
        self._log = log.open("ab")
        self._loop = asyncio.get_running_loop()
        self._ready = asyncio.Event()
        self.url: str | None = None
        self.stdout: list[str] = []
        spawn_ms = int(time.time() * 1000)
        self._t0 = time.monotonic()
        self.proc = subprocess.Popen(
            die_with_parent([str(exe), "serve", "--port", "0", "--data-dir", str(data_dir)]),
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._log,
        )
        Server.live.add(self.proc)
        self.boot = Boot(index=index, pid=self.proc.pid, spawn_ms=spawn_ms)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            if self.url is None and " listening on " in line:
                self.boot.listening_s = round(time.monotonic() - self._t0, 4)
                self.url = line.rsplit(" ", 1)[-1]
                self._signal()
            self.stdout.append(line)
        self._signal()  # end of output: the process is gone

    def _signal(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is already closed
            self._loop.call_soon_threadsafe(self._ready.set)

    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    async def listening(self) -> str | None:
        """The URL once the listening line is out; None if the process ended or took too long."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ready.wait(), START_TIMEOUT_S)
        return self.url

    def kill(self) -> None:
        """SIGKILL: the simulated crash."""
        if self.proc.poll() is None:
            self.boot.kill_after_s = round(self.elapsed(), 3)
            os.kill(self.proc.pid, signal.SIGKILL)
            self.boot.killed = True
        self._reap(10)

    def terminate(self, timeout: float = 20) -> bool:
        """SIGTERM, the graceful stop; True when it exited in time."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        return self._reap(timeout)

    def _reap(self, timeout: float) -> bool:
        graceful = True
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            graceful = False
            self.proc.kill()
            self.proc.wait(10)
        self.boot.exit_code = self.proc.returncode
        Server.live.discard(self.proc)
        self._reader.join(5)
        self._log.close()
        return graceful

    @classmethod
    def kill_all(cls) -> None:
        for proc in list(cls.live):
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
            cls.live.discard(proc)


# -- the workload ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Request:
    """An admission the client sent; with an id it can be retried exactly."""

    session_id: str
    kind: str  # "user" | "synthetic"
    text: str
    inbox_id: str | None
    delivery: Delivery
    resume: bool


@dataclasses.dataclass
class Stats:
    sent: int = 0
    with_id: int = 0
    receipts: int = 0
    unknown_no_id: int = 0
    retries_same: int = 0
    retries_different: int = 0
    retries_concurrent: int = 0
    retries_after_crash: int = 0
    committed_before_kill: int = 0
    interrupts: int = 0
    tool_prompts: int = 0
    markers: int = 0
    shells: int = 0
    reverts: int = 0
    #: Kills at each revert pause point (mid-revert boots).
    revert_kills: dict[str, int] = dataclasses.field(default_factory=collections.Counter)
    asks_answered: dict[str, int] = dataclasses.field(default_factory=collections.Counter)
    answers_refused: int = 0


class Sim:
    def __init__(self, args: argparse.Namespace, workdir: Path, exe: Path) -> None:
        self.args = args
        self.seed: int = args.seed
        self.workdir = workdir
        self.data_dir = workdir / "data"
        self.ledger = workdir / "ledger.txt"
        self.exe = exe
        self.sessions: list[str] = []
        #: A session in a git work tree for shells and reverts; outside ``sessions``,
        #: whose admissions check (a) follows (a committed revert removes rows).
        self.revert_session: str | None = None
        self.receipts: list[Receipt] = []
        self.unknown: dict[str, Request] = {}
        self.history: dict[str, list[Request]] = collections.defaultdict(list)
        self.stats = Stats()
        self.boots: list[Boot] = []
        self.violations: list[Violation] = []
        self.notes: list[str] = []
        self._counter = 0
        self._armed = ""
        #: Reverts across symlink swaps (the symlink-revert boots).
        self.swaps = Swaps(workdir, self.data_dir)
        #: The mid-revert boot's pause point and marker file.
        self._pause: tuple[str, Path] | None = None
        self._tool_seen = asyncio.Event()
        self._server: Server | None = None
        #: Answers in flight (the answerer's children): cancelled with their boot.
        self._answers: set[asyncio.Task[None]] = set()

    # -- helpers

    def rng(self, *parts: object) -> random.Random:
        return random.Random("/".join(map(str, (self.seed, *parts))))

    def log(self, message: str) -> None:
        if not self.args.quiet:
            print(f"crashsim: {message}", file=sys.stderr, flush=True)

    def _name(self, tag: str) -> str:
        self._counter += 1
        return f"{tag}n{self._counter}"

    def marker(self, tag: str) -> str:
        self.stats.markers += 1
        return f"CSM_{self._name(tag)}"

    def tool_line(self, rng: random.Random, tag: str, *, ask: bool | None = None) -> str:
        marker = self.marker(tag)
        ledger = shlex.quote(str(self.ledger))
        pause = rng.choice(("0.1", "0.2", "0.3"))
        stamp = '$PPID $(date +%s%3N)"'
        command = (
            f'echo "S {marker} {stamp} >> {ledger}; sleep {pause}; '
            f'echo "D {marker} {stamp} >> {ledger}'
        )
        if ask or (ask is None and rng.random() < 0.35):
            # The marker makes the asked simple command unique to this call: an
            # "always" answer covers only this call's own command.
            command = f"{ASK} {marker}; {command}"
        return "#tool bash " + json.dumps({"command": command})

    def text(
        self,
        rng: random.Random,
        tag: str,
        *,
        tools: bool | None = None,
        fast: bool = False,
        ask: bool | None = None,
    ) -> str:
        """A prompt: prose, or a script of 1-2 steps with 1-2 tool calls each."""
        if tools is None:
            tools = rng.random() < 0.5
        if not tools:
            if rng.random() < 0.4:
                return f"crashsim {tag}: plain prose, the default reply"
            delay = rng.randint(2, 15)
            return f"crashsim {tag}\n#delay {delay}\n#text a slow answer for {tag}, chunk by chunk"
        self.stats.tool_prompts += 1
        lines = [f"crashsim {tag}"]
        for step in range(rng.randint(1, 2)):
            if step:
                lines.append("#step")
            if not fast and rng.random() < 0.5:
                lines.append(f"#delay {rng.randint(1, 8)}")
            lines.append(f"#text step {step} of {tag}")
            lines += [self.tool_line(rng, tag, ask=ask) for _ in range(rng.randint(1, 2))]
        return "\n".join(lines)

    def request(self, rng: random.Random, tag: str, **text: Any) -> Request:
        with_id = rng.random() < 0.6
        kind = "synthetic" if rng.random() < 0.12 else "user"
        return Request(
            session_id=rng.choice(self.sessions),
            kind=kind,
            text=self.text(rng, tag, **text) if kind == "user" else f"crashsim note {tag}",
            inbox_id=f"msg_cs{self._name(tag)}" if with_id else None,
            delivery="steer" if rng.random() < 0.65 else "queue",
            resume=rng.random() < 0.85,
        )

    async def send(self, client: Client, req: Request, *, retry: bool = False) -> bool:
        """Send one admission; record its receipt, or an unknown outcome."""
        self.stats.sent += 1
        if req.inbox_id is not None:
            self.stats.with_id += 1
            self.history[req.session_id].append(req)
        done = False
        try:
            if req.kind == "user":
                item = await client.sessions.prompt(
                    req.session_id,
                    PromptInput(
                        id=req.inbox_id, text=req.text, delivery=req.delivery, resume=req.resume
                    ),
                )
            else:
                item = await client.sessions.synthetic(
                    req.session_id,
                    SyntheticInput(
                        id=req.inbox_id, text=req.text, delivery=req.delivery, resume=req.resume
                    ),
                )
            done = True
        except ClientError:
            return False  # the kill: the outcome is unknown
        except DomainError as exc:
            done = True
            self.violations.append(
                Violation("api.error", f"{req.kind} {req.inbox_id} on {req.session_id}: {exc!r}")
            )
            return False
        finally:
            if not done:
                if req.inbox_id is not None:
                    self.unknown.setdefault(req.inbox_id, req)
                else:
                    self.stats.unknown_no_id += 1
        self.stats.receipts += 1
        receipt = Receipt.of(item, retry=retry)
        self.receipts.append(receipt)
        if req.inbox_id is not None:
            self.unknown.pop(req.inbox_id, None)
            if item.id != req.inbox_id:
                self.violations.append(
                    Violation("receipt.id", f"asked for {req.inbox_id}, receipt says {item.id}")
                )
        return True

    async def retry_unknown(self, client: Client) -> None:
        todo = list(self.unknown.values())
        if not todo:
            return
        self.stats.retries_after_crash += len(todo)
        before = len(self.receipts)
        await asyncio.gather(*(self.send(client, req, retry=True) for req in todo))
        # A receipt older than this process: the killed one had committed it, unanswered.
        spawned = self.boots[-1].spawn_ms
        old = sum(r.time_created < spawned for r in self.receipts[before:])
        self.stats.committed_before_kill += old
        self.log(f"  retried {len(todo)} requests with an unknown outcome ({old} had committed)")

    async def worker(self, client: Client, rng: random.Random, tag: str) -> None:
        while True:
            roll = rng.random()
            if roll < 0.45:
                await self.send(client, self.request(rng, self._name(tag)))
            elif roll < 0.70:
                mine = [r for reqs in self.history.values() for r in reqs]
                original = mine[rng.randrange(len(mine))] if mine else None
                if original is None:
                    pass
                elif roll < 0.56:
                    self.stats.retries_same += 1
                    await self.send(client, original, retry=True)
                elif roll < 0.63:
                    self.stats.retries_different += 1
                    text = (
                        self.text(rng, self._name(tag))
                        if original.kind == "user"
                        else f"crashsim other note {tag}"
                    )
                    await self.send(client, dataclasses.replace(original, text=text), retry=True)
                else:
                    self.stats.retries_concurrent += 2
                    await asyncio.gather(
                        self.send(client, original, retry=True),
                        self.send(client, original, retry=True),
                    )
            elif roll < 0.78:
                await self.shell_or_revert(client, rng, tag)
            elif roll < 0.80:
                sid = rng.choice(self.sessions)
                self.stats.interrupts += 1
                with contextlib.suppress(ClientError):
                    await client.sessions.interrupt(sid, InterruptQuery(resume=rng.random() < 0.5))
            await asyncio.sleep(rng.uniform(0.005, 0.06))

    async def boot_shells_and_reverts(self, client: Client, rng: random.Random, tag: str) -> None:
        """Each boot: a shell the kill will find running, and a revert step on the git session."""
        sid = self.revert_session
        if sid is None:
            return
        self.stats.shells += 1
        with contextlib.suppress(ClientError, DomainError):
            await client.sessions.shell(
                rng.choice([*self.sessions, sid]),
                ShellInput(id=f"msg_cssh{self._name(tag)}", command="sleep 60"),
            )
        with contextlib.suppress(ClientError, TimeoutError):
            await asyncio.wait_for(client.sessions.wait(sid), 5)  # a revert needs it idle
        for roll in (rng.uniform(0.65, 1.0), 0.5):
            await self.shell_or_revert(client, rng, tag, roll)

    async def shell_or_revert(
        self, client: Client, rng: random.Random, tag: str, roll: float | None = None
    ) -> None:
        """A user shell (any session), or a revert step on the git session."""
        sid = self.revert_session
        if sid is None:
            return
        roll = rng.random() if roll is None else roll
        try:
            await self._shell_or_revert(client, rng, tag, sid, roll)
        except ClientError:
            pass  # the kill
        except DomainError as exc:
            # Busy (409) while the git session runs, or its message vanished: expected.
            if exc.status not in (404, 409):
                self.violations.append(Violation("api.error", f"shell/revert: {exc!r}"))

    async def _shell_or_revert(
        self, client: Client, rng: random.Random, tag: str, sid: str, roll: float
    ) -> None:
        if True:
            if roll < 0.4:
                self.stats.shells += 1
                target = rng.choice([*self.sessions, sid])
                command = f"echo {self._name(tag)} >> shell.log; sleep {rng.choice((0, 0.2, 1))}"
                await client.sessions.shell(
                    target, ShellInput(id=f"msg_cssh{self._name(tag)}", command=command)
                )
            elif roll < 0.65:
                name = self._name(tag)
                text = (
                    "#tool write "
                    + json.dumps({"path": f"f{rng.randint(0, 3)}.txt", "content": name})
                    + "\n---\n#text wrote"
                )
                await client.sessions.prompt(sid, PromptInput(text=text))
            else:
                page = await client.sessions.messages(sid, MessagesQuery(limit=20))
                users = [m.id for m in page.data if m.type == "user"]
                self.stats.reverts += 1
                if users and roll < 0.85:
                    await client.sessions.revert_stage(
                        sid, RevertStageInput(message_id=rng.choice(users), files=True)
                    )
                elif roll < 0.93:
                    await client.sessions.revert_clear(sid)
                else:
                    await client.sessions.revert_commit(sid)

    async def trigger_mid_revert(
        self, rng: random.Random, client: Client, tag: str
    ) -> list[asyncio.Task[Any]]:
        """Make a revert of the git session reach the hook's point; the kill follows.

        A worker's revert may reach it first: it holds the session's lock for good,
        so every attempt races the marker file, never waits on a request alone.
        """
        assert self._pause is not None
        point, marker = self._pause
        for _ in range(20):
            attempt = asyncio.create_task(self._revert_attempt(rng, client, tag, point))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(REQUEST_TIMEOUT_S):
                    for _ in itertools.count():
                        if marker.exists() or attempt.done():
                            break
                        await asyncio.sleep(0.01)
            if marker.exists():
                self.stats.revert_kills[point] += 1
                return [attempt]
            attempt.cancel()
            with contextlib.suppress(
                asyncio.CancelledError, DomainError, ClientError, TimeoutError
            ):
                await attempt  # busy (409) while it runs, or nothing to restore: again
            await asyncio.sleep(0.05)
        self.notes.append(f"mid-revert: no revert reached {point}")
        return []

    async def _revert_attempt(
        self, rng: random.Random, client: Client, tag: str, point: str
    ) -> None:
        sid = self.revert_session
        assert sid is not None
        await asyncio.wait_for(client.sessions.wait(sid), 5)  # a revert needs it idle
        page = await client.sessions.messages(sid, MessagesQuery(limit=20))
        users = [m.id for m in page.data if m.type == "user"]
        if len(users) < 2 or rng.random() < 0.3:
            # Files for the revert to restore: a step writing two or three.
            paths = rng.sample([f"f{i}.txt" for i in range(4)], rng.randint(2, 3))
            calls = [
                "#tool write " + json.dumps({"path": p, "content": self._name(tag)}) for p in paths
            ]
            text = "\n".join([*calls, "---", "#text wrote"])
            await client.sessions.prompt(sid, PromptInput(text=text))
            return
        stage = RevertStageInput(message_id=rng.choice(users), files=True)
        await client.sessions.revert_stage(sid, stage)  # passes every point but stage.*
        if point == "commit":
            await client.sessions.revert_commit(sid)
        elif point.startswith("clear."):
            await client.sessions.revert_clear(sid)

    async def check_after_revert_kill(self, index: int) -> None:
        """Right after the restart that recovered a mid-revert kill: files agree with the log."""
        if index == 0 or self.boots[index - 1].mode not in ("mid-revert", "symlink-revert"):
            return
        db = self.data_dir / DB_NAME

        def check() -> list[Violation]:
            conn = _open_ro(db)
            try:
                events = load_events(conn)
                found = revert_leftovers(self.data_dir, conn, events, "after the restart")
                swaps = self.swaps.check(conn, events, "after the restart")
                return found + [Violation(kind, detail) for kind, detail in swaps]
            finally:
                conn.close()

        self.violations += await asyncio.to_thread(check)

    async def feed(self, client: Client, connected: asyncio.Event) -> None:
        with contextlib.suppress(ClientError):
            async with contextlib.aclosing(client.events.subscribe()) as stream:
                async for event in stream:
                    if event.event == "server.connected":
                        connected.set()
                    elif event.event == "session.tool.called" and self._armed:
                        command = str(event.data["data"].get("input", {}).get("command", ""))
                        if any(m.startswith(self._armed) for m in MARKER.findall(command)):
                            self._tool_seen.set()
        connected.set()

    async def answerer(self, client: Client, rng: random.Random) -> None:
        """Answer every pending permission request, each after a random pause."""
        seen: set[str] = set()
        while True:
            for sid in self.sessions:
                with contextlib.suppress(ClientError, DomainError):
                    for request in await client.sessions.permissions(sid):
                        if request.id not in seen:
                            seen.add(request.id)
                            task = asyncio.create_task(self.answer(client, rng, sid, request.id))
                            self._answers.add(task)
                            task.add_done_callback(self._answers.discard)
            await asyncio.sleep(rng.uniform(0.01, 0.08))

    async def answer(self, client: Client, rng: random.Random, sid: str, pid: str) -> None:
        await asyncio.sleep(rng.uniform(0.0, 0.3))
        reply = rng.choice(("once", "once", "always", "reject"))
        try:
            await client.sessions.reply_permission(sid, pid, PermissionReplyInput(reply=reply))
        except ClientError:
            return  # the kill
        except DomainError:
            self.stats.answers_refused += 1  # its call settled first (interrupt, crash)
            return
        self.stats.asks_answered[reply] += 1

    # -- kill triggers: each returns when it is time to kill

    async def trigger_mid_ask(self, rng: random.Random, client: Client, tag: str) -> list[Any]:
        """Kill while a call waits for its answer (sometimes just after answering it)."""
        await asyncio.sleep(rng.uniform(0.05, 0.2))
        tasks = []
        for _ in range(rng.randint(1, 2)):
            name = self._name(tag)
            req = Request(
                session_id=rng.choice(self.sessions),
                kind="user",
                text=self.text(rng, name, tools=True, fast=True, ask=True),
                inbox_id=f"msg_cs{name}" if rng.random() < 0.6 else None,
                delivery="steer",
                resume=True,
            )
            tasks.append(asyncio.create_task(self.send(client, req)))
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            for sid in self.sessions:
                with contextlib.suppress(ClientError, DomainError):
                    pending = await client.sessions.permissions(sid)
                    if pending:
                        if rng.random() < 0.5:
                            tasks.append(
                                asyncio.create_task(self.answer(client, rng, sid, pending[0].id))
                            )
                            await asyncio.sleep(rng.uniform(0, 0.05))
                        return tasks
            await asyncio.sleep(0.01)
        self.notes.append(f"boot {tag}: no permission request seen in 8 s; killed anyway")
        return tasks

    async def trigger_random(self, rng: random.Random, client: Client, tag: str) -> None:
        await asyncio.sleep(rng.uniform(0.3, 1.5))

    async def trigger_mid_tool(self, rng: random.Random, client: Client, tag: str) -> list[Any]:
        await asyncio.sleep(rng.uniform(0.1, 0.4))
        self._armed = f"CSM_{tag}"
        self._tool_seen.clear()
        tasks = []
        for _ in range(rng.randint(1, 3)):
            name = self._name(tag)
            req = Request(
                session_id=rng.choice(self.sessions),
                kind="user",
                text=self.text(rng, name, tools=True, fast=True),
                inbox_id=f"msg_cs{name}" if rng.random() < 0.6 else None,
                delivery="steer",
                resume=True,
            )
            tasks.append(asyncio.create_task(self.send(client, req)))
        try:
            await asyncio.wait_for(self._tool_seen.wait(), 8)
        except TimeoutError:
            self.notes.append(f"boot {tag}: no tool.called seen in 8 s; killed anyway")
        await asyncio.sleep(rng.choice((0.0, rng.uniform(0, 0.05), rng.uniform(0.05, 0.35))))
        return tasks

    async def trigger_group_commit(
        self, rng: random.Random, client: Client, tag: str
    ) -> tuple[list[Any], int]:
        await asyncio.sleep(rng.uniform(0.2, 0.6))
        size = rng.randint(40, 120)
        kill_at = rng.randint(1, max(1, size // 3))
        got = 0
        fire = asyncio.Event()

        async def one(req: Request) -> None:
            nonlocal got
            if await self.send(client, req):
                got += 1
                if got >= kill_at:
                    fire.set()

        reqs = [self.request(rng, self._name(tag), tools=False) for _ in range(size)]
        # A few exact duplicates inside the burst: concurrent retries of one id.
        for _ in range(rng.randint(1, 4)):
            original = rng.choice(reqs)
            if original.inbox_id is not None:
                reqs.insert(rng.randrange(len(reqs)), original)
                self.stats.retries_concurrent += 1
        tasks = [asyncio.create_task(one(r)) for r in reqs]
        try:
            await asyncio.wait_for(fire.wait(), 8)
        except TimeoutError:
            self.notes.append(f"boot {tag}: burst saw {got} receipts in 8 s; killed anyway")
        return tasks, sum(not t.done() for t in tasks)

    # -- boots

    def spawn(self, env: Mapping[str, str] | None = None) -> Server:
        index = len(self.boots)
        if index == 0:
            self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            (self.data_dir / "agents.toml").write_text(AGENTS_TOML)
        server = Server(
            self.exe, self.data_dir, self.workdir, self.workdir / f"boot-{index}.log", index, env
        )
        self.boots.append(server.boot)
        self._server = server
        return server

    async def start(self, mode: str) -> Server | None:
        env = None
        if mode in ("mid-revert", "symlink-revert"):
            index = len(self.boots)
            self._pause = (
                self.rng("revert", index).choice(sorted(PAUSE_POINTS)),
                self.workdir / f"revert-paused-{index}",
            )
            env = {PAUSE_ENV: f"{self._pause[0]}:{self._pause[1]}"}
        server = self.spawn(env)
        server.boot.mode = mode
        if mode == "startup":
            previous = [b.listening_s for b in self.boots if b.listening_s is not None]
            estimate = previous[-1] if previous else 1.0
            await asyncio.sleep(self.rng("startup", server.boot.index).uniform(0.7, 1.1) * estimate)
            server.boot.note = (
                "listening before the kill" if server.url else "killed while starting"
            )
            server.kill()
            return None
        url = await server.listening()
        if url is None:
            server.kill()
            tail = "\n".join(
                (self.workdir / f"boot-{server.boot.index}.log")
                .read_text(errors="replace")
                .splitlines()[-15:]
            )
            self.violations.append(
                Violation(
                    "server.start",
                    f"boot {server.boot.index} did not start (exit {server.boot.exit_code}); "
                    f"log tail:\n{tail}",
                )
            )
            return None
        return server

    async def iteration(self, index: int, mode: str) -> None:
        server = await self.start(mode)
        self.log(
            f"boot {index}: {mode}" + (f", up in {server.boot.listening_s:.2f} s" if server else "")
        )
        if server is None:
            return
        assert server.url is not None
        tag = f"{index}_"
        rng = self.rng("boot", index)
        tasks: list[asyncio.Task[Any]] = []
        await self.check_after_revert_kill(index)
        try:
            async with Client(server.url, timeout=REQUEST_TIMEOUT_S) as client:
                connected = asyncio.Event()
                tasks.append(asyncio.create_task(self.feed(client, connected)))
                await asyncio.wait_for(connected.wait(), 10)
                if not self.sessions:
                    for k in range(self.args.sessions):
                        session = await client.sessions.create(
                            CreateSessionInput(title=f"crashsim {k}", agent=AGENT)
                        )
                        self.sessions.append(session.id)
                    project = self.workdir / "project"
                    await asyncio.to_thread(_git_project, project)
                    session = await client.sessions.create(
                        CreateSessionInput(
                            title="crashsim git", location=Location(directory=str(project))
                        )
                    )
                    self.revert_session = session.id
                await self.retry_unknown(client)
                await self.boot_shells_and_reverts(client, self.rng("boot", index, "git"), tag)
                for w in range(WORKERS):
                    worker_rng = self.rng("boot", index, "worker", w)
                    tasks.append(asyncio.create_task(self.worker(client, worker_rng, f"{tag}w{w}")))
                answer_rng = self.rng("boot", index, "answers")
                tasks.append(asyncio.create_task(self.answerer(client, answer_rng)))
                if mode == "mid-tool":
                    tasks += await self.trigger_mid_tool(rng, client, tag)
                elif mode == "mid-ask":
                    tasks += await self.trigger_mid_ask(rng, client, tag)
                elif mode == "mid-revert":
                    tasks += await self.trigger_mid_revert(rng, client, tag)
                elif mode == "symlink-revert":
                    assert self._pause is not None
                    tasks += await self.swaps.trigger(client, rng, index, self._pause, _INPUTS)
                elif mode == "group-commit":
                    burst, in_flight = await self.trigger_group_commit(rng, client, tag)
                    tasks += burst
                    server.boot.in_flight_at_kill = in_flight
                else:
                    await self.trigger_random(rng, client, tag)
                server.kill()
                self._armed = ""
                tasks += self._answers
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            server.kill()

    async def settle(self) -> None:
        server = await self.start("final")
        if server is None:
            return
        await self.check_after_revert_kill(server.boot.index)
        assert server.url is not None
        self.log(
            f"boot {server.boot.index}: final, up in {server.boot.listening_s:.2f} s; settling"
        )
        try:
            async with Client(server.url, timeout=SETTLE_TIMEOUT_S) as client:
                answers = asyncio.create_task(self.answerer(client, self.rng("final", "answers")))
                try:
                    await self.retry_unknown(client)
                    await self._settle(client)
                finally:
                    pending = [answers, *self._answers]
                    for task in pending:
                        task.cancel()
                    await asyncio.gather(*pending, return_exceptions=True)
                await self.check_api(client)
        finally:
            if not server.terminate():
                self.notes.append("the final server did not stop within 20 s of SIGTERM")

    async def _settle(self, client: Client) -> None:
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while True:
            if not await client.sessions.active():
                await asyncio.wait_for(
                    asyncio.gather(*(client.sessions.wait(s) for s in self.sessions)),
                    max(1.0, deadline - time.monotonic()),
                )
                if not await client.sessions.active():
                    break
            if time.monotonic() > deadline:
                active = sorted(await client.sessions.active())
                self.violations.append(
                    Violation("settle.timeout", f"still active after settle: {active}")
                )
                break
            await asyncio.sleep(0.05)

    async def check_api(self, client: Client) -> None:
        pending: set[str] = set()
        delivered: set[str] = set()
        for sid in self.sessions:
            pending |= {item.id for item in await client.sessions.inbox(sid)}
            page = await client.sessions.messages(sid, MessagesQuery(limit=200, order="asc"))
            while True:
                delivered |= {m.id for m in page.data}
                if page.cursor.next is None:
                    break
                page = await client.sessions.messages_next(sid, page.cursor.next)
        for inbox_id in sorted({r.inbox_id for r in self.receipts}):
            if (inbox_id in pending) == (inbox_id in delivered):
                self.violations.append(
                    Violation(
                        "api.admission",
                        f"{inbox_id}: pending={inbox_id in pending} "
                        f"delivered={inbox_id in delivered} in the API after settle",
                    )
                )

    async def run(self) -> None:
        rng = self.rng("schedule")
        kinds = self.args.modes
        modes = [kinds[i % len(kinds)] for i in range(self.args.iterations)]
        rng.shuffle(modes)
        if modes and modes[0] == "startup":
            swap = next((i for i, m in enumerate(modes) if m != "startup"), 0)
            modes[0], modes[swap] = modes[swap], modes[0]
        for index, mode in enumerate(modes):
            await self.iteration(index, mode)
        await self.settle()


def _git_project(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    (path / ".gitignore").write_text("shell.log\n")


# -- report ------------------------------------------------------------------------------------


def build_report(sim: Sim, started: float) -> dict[str, Any]:
    db = sim.data_dir / DB_NAME
    counts: dict[str, int] = {}
    timeline: list[dict[str, Any]] = []
    ledger, _ = read_ledger(sim.ledger)
    if db.exists():
        conn = _open_ro(db)
        try:
            for type_, n in conn.execute("SELECT type, count(*) FROM event GROUP BY type"):
                counts[type_.rsplit(".", 1)[0]] = counts.get(type_.rsplit(".", 1)[0], 0) + n
            aborted = conn.execute(
                "SELECT count(*) FROM event WHERE type LIKE 'session.tool.failed.%'"
                " AND json_extract(data, '$.error.type') = 'aborted'"
            ).fetchone()[0]
        finally:
            conn.close()
        timeline = recovery_timeline(db, sim.boots)
        tools = tool_summary(db, ledger, sim.boots)
    else:
        aborted = 0
        tools = {}
    logs = sorted(sim.workdir.glob("boot-*.log"))
    tracebacks = sum(p.read_text(errors="replace").count("Traceback") for p in logs)
    kills = [b for b in sim.boots if b.killed]
    by_boot = {row["boot"]: row for row in timeline}
    stats = sim.stats
    return {
        "seed": sim.seed,
        "sessions": len(sim.sessions),
        "iterations": sim.args.iterations,
        "duration_s": round(time.monotonic() - started, 2),
        "data_dir": str(sim.workdir) if sim.args.keep else None,
        "kills": len(kills),
        "kill_modes": dict(collections.Counter(b.mode for b in kills)),
        "boots": [
            {
                **dataclasses.asdict(b),
                **{k: by_boot.get(b.index, {}).get(k) for k in ("recovered", "resumed_s")},
            }
            for b in sim.boots
        ],
        "admissions": {
            "sent": stats.sent,
            "with_id": stats.with_id,
            "receipts": stats.receipts,
            "distinct_admitted": len({r.inbox_id for r in sim.receipts}),
            "unknown_outcome_without_id": stats.unknown_no_id,
            "enqueued_events": counts.get("session.inbox.enqueued", 0),
            "delivered_events": counts.get("session.inbox.delivered", 0),
        },
        "retries": {
            "same_payload": stats.retries_same,
            "different_payload": stats.retries_different,
            "concurrent_duplicates": stats.retries_concurrent,
            "shells": stats.shells,
            "reverts": stats.reverts,
            "revert_kills": dict(sorted(stats.revert_kills.items())),
            "symlink_swaps": sim.swaps.report(),
            "after_crash": stats.retries_after_crash,
            "after_crash_already_committed": stats.committed_before_kill,
        },
        "interrupts": stats.interrupts,
        "permissions": {
            "asked": counts.get("session.permission.asked", 0),
            "replied": counts.get("session.permission.replied", 0),
            "answers": dict(stats.asks_answered),
            "answers_refused": stats.answers_refused,
        },
        "events": sum(counts.values()),
        "tool_calls": {
            "prompts_with_tools": stats.tool_prompts,
            "markers_issued": stats.markers,
            "called": counts.get("session.tool.called", 0),
            "succeeded": counts.get("session.tool.success", 0),
            "failed": counts.get("session.tool.failed", 0),
            "failed_aborted": aborted,
            "ledger_starts": sum(line.kind == "S" for line in ledger),
            "ledger_done": sum(line.kind == "D" for line in ledger),
            **tools,
        },
        "recovered_sessions": sum(row["recovered"] for row in timeline),
        "recovery": [row for row in timeline if row["boot"] > 0],
        "server_tracebacks_logged": tracebacks,
        "notes": sim.notes,
        "violations": [dataclasses.asdict(v) for v in sim.violations],
    }


def render(report: dict[str, Any]) -> str:
    a, r, t = report["admissions"], report["retries"], report["tool_calls"]
    pm = report["permissions"]
    modes = ", ".join(f"{k} {v}" for k, v in sorted(report["kill_modes"].items()))
    lines = [
        f"crashsim: seed {report['seed']}, {report['sessions']} sessions, "
        f"{report['iterations']} iterations, {report['duration_s']:.1f} s",
        f"  kills:        {report['kills']} ({modes})",
        f"  admissions:   {a['sent']} sent ({a['with_id']} with an id), {a['receipts']} receipts"
        f" for {a['distinct_admitted']} ids; {a['unknown_outcome_without_id']} lost to a kill"
        f" without an id; {a['enqueued_events']} enqueued, {a['delivered_events']} delivered",
        f"  retries:      {r['same_payload']} same payload, {r['different_payload']} different"
        f" payload, {r['concurrent_duplicates']} concurrent duplicates, {r['after_crash']}"
        f" after a crash ({r['after_crash_already_committed']} of them committed before the kill)",
        f"  interrupts:   {report['interrupts']}",
        f"  symlink swaps: {_swaps_line(r['symlink_swaps'])}",
        f"  permissions:  {pm['asked']} asked, {pm['replied']} replied {pm['answers']},"
        f" {pm['answers_refused']} answers refused (the call had settled)",
        f"  events:       {report['events']}",
        f"  tool calls:   {t['called']} called, {t['succeeded']} succeeded, {t['failed']} failed"
        f" ({t['failed_aborted']} aborted, {t.get('stale_failed', 0)} of them stale: failed by"
        f" a later boot, {t.get('stale_failed_after_side_effect', 0)} after their side effect"
        f" began)",
        f"                ledger {t['ledger_starts']} started, {t['ledger_done']} done"
        f" ({t.get('ledger_lines_by_a_known_server_pid', 0)} lines by a known server pid);"
        f" {t['markers_issued']} markers issued",
        f"  recovered:    {report['recovered_sessions']} sessions (sum over boots of"
        " session.execution.recovering)",
        "  time to recover (from spawn; sweep done = listening line, resumed = last recovered"
        " session's execution.started):",
        "    boot  mode          killed  in flight  recovered  sweep done  resumed",
    ]
    rows = {row["boot"]: row for row in report["recovery"]}
    for boot in report["boots"]:
        row = rows.get(boot["index"])
        sweep = "-" if boot["listening_s"] is None else f"{boot['listening_s']:.3f} s"
        resumed = "-" if row is None or row["resumed_s"] is None else f"{row['resumed_s']:.3f} s"
        killed = "-" if boot["kill_after_s"] is None else f"{boot['kill_after_s']:.2f} s"
        recovered = "-" if row is None else str(row["recovered"])
        flight = boot["in_flight_at_kill"]
        flight = "-" if flight is None else str(flight)
        lines.append(
            f"    {boot['index']:>4}  {boot['mode']:<12}  {killed:>6}  {flight:>9}  {recovered:>9}"
            f"  {sweep:>10}  {resumed:>7}"
        )
    if report["server_tracebacks_logged"]:
        lines.append(
            f"  server logged {report['server_tracebacks_logged']} tracebacks (boot-*.log)"
        )
    for note in report["notes"]:
        lines.append(f"  note: {note}")
    if report["data_dir"]:
        lines.append(f"  data dir kept: {report['data_dir']}")
    violations = report["violations"]
    lines.append(f"  violations:   {len(violations)}")
    for v in violations:
        lines.append(f"    [{v['check']}] {v['detail']}")
    lines.append("PASS" if not violations else "FAIL")
    return "\n".join(lines)


# -- main --------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--sessions", type=int, default=8, help="sessions (default: %(default)s)")
    parser.add_argument(
        "--iterations",
        type=int,
        default=len(KILL_MODES),
        help="boots killed with SIGKILL (default: %(default)s, each kill mode once)",
    )
    parser.add_argument(
        "--modes",
        default=",".join(KILL_MODES),
        help="the kill modes the boots take in turn, comma-separated (default: all)",
    )
    parser.add_argument("--seed", type=int, default=None, help="seed (default: a random one)")
    parser.add_argument("--keep", action="store_true", help="keep the data dir, print its path")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument(
        "--hosts", type=int, default=1, help="servers on one database (default: %(default)s)"
    )
    parser.add_argument(
        "--database", default=None, help="with --hosts > 1: the postgresql:// URL they share"
    )
    parser.add_argument(
        "--duration", type=float, default=10.0, help="with --hosts > 1: seconds of workload"
    )
    parser.add_argument(
        "--lease-ttl-ms", type=int, default=1500, help="with --hosts > 1: each host's lease ttl"
    )
    args = parser.parse_args(argv)
    if args.sessions < 1 or args.iterations < 1 or args.hosts < 1:
        parser.error("--sessions, --iterations and --hosts must be positive")
    args.modes = tuple(m for m in args.modes.split(",") if m)
    if not args.modes or set(args.modes) - set(KILL_MODES):
        parser.error(f"--modes takes some of {', '.join(KILL_MODES)}")
    if args.hosts > 1 and not (args.database or "").startswith(("postgresql://", "postgres://")):
        parser.error("--hosts > 1 needs --database postgresql://… (one database for every host)")
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 1_000_000)
    return args


async def _bounded(sim: Sim, budget: float) -> bool:
    """Run the simulation; False when it overran ``budget`` seconds (it is cancelled)."""
    task = asyncio.create_task(sim.run())
    done, _ = await asyncio.wait({task}, timeout=budget)
    if not done:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return False
    task.result()
    return True


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    exe = Path(sys.executable).parent / "sessionrt"
    if not exe.exists():
        print(f"crashsim: no sessionrt console script next to {sys.executable}", file=sys.stderr)
        return 2
    if args.hosts > 1:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import _crashsim_hosts

        return _crashsim_hosts.main(args, exe, sys.modules[__name__])
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="crashsim-"))
    sim = Sim(args, workdir, exe)
    budget = 60 + args.iterations * 30
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        try:
            if not asyncio.run(_bounded(sim, budget)):
                sim.violations.append(Violation("harness.timeout", f"the run took over {budget} s"))
        finally:
            Server.kill_all()
        db = sim.data_dir / DB_NAME
        if db.exists():
            settled = not any(
                v.check in ("server.start", "settle.timeout", "harness.timeout")
                for v in sim.violations
            )
            sim.violations += check_database(
                db, sim.receipts, sim.ledger, sim.boots, settled=settled
            )
            conn = _open_ro(db)
            try:
                swaps = sim.swaps.check(conn, load_events(conn), "after the settle")
            finally:
                conn.close()
            sim.violations += [Violation(kind, detail) for kind, detail in swaps]
        report = build_report(sim, started)
    except Exception:
        traceback.print_exc()
        kept = f"; data dir kept: {workdir}" if args.keep else ""
        print(f"crashsim: the harness failed (seed {args.seed}){kept}", file=sys.stderr)
        return 2
    finally:
        Server.kill_all()
        signal.signal(signal.SIGTERM, previous)
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(report, indent=2) if args.json else render(report), flush=True)
    return 1 if report["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
