"""Permission decisions for one tool call, and the calls that wait for an answer.

:func:`judge` turns an agent's rules (:mod:`actors.tools._permission`), the
session's ``always`` rules and one call into a list of :class:`Check`\\ s, in
the order they are settled: ``external_directory`` for a file tool's path
outside the session's directory, then the tool's own rule. A check is
``allow``, ``deny`` (the call fails with ``permission.denied``) or ``ask``
(the call waits for a reply: ``session.permission.asked`` is durable before
the wait, and only ``once``/``always`` lets it run).

Subjects, the strings the patterns are matched against:

- bash: each command the line runs, read with a shell grammar
  (:func:`~actors.tools._shell_grammar.bash_subjects`: quoting removed,
  wrappers such as ``env``, ``sudo``, ``xargs``, ``sh -c`` resolved to what
  they run); the most restrictive answer over them wins, so ``git status;
  rm -rf x`` asks (or is denied) if ``rm -rf x`` would be, whatever ``git *``
  says. A line whose commands cannot be resolved (it does not parse, a
  command name expands) is asked about unless the rules deny it.
- read, write, edit, list, glob, grep: the path, relative to the session's
  directory when inside it, else absolute, after resolving ``..`` and every
  symlink (a link that escapes is judged where it leads). A path outside
  the directory also needs ``external_directory``, judged on the resolved
  absolute path; managed tool-output files stay readable without it. An
  ``always`` reply to an external path allows its directory (``<dir>/*``).
- any other tool: no subject; its rule must be a plain decision or a
  table's ``*``.

:class:`PermissionWaiters` holds the futures of the calls waiting right now,
one per call (so bounded by the calls in flight); a reply resolves one after
it is durable. A call that waits across a crash is never run: recovery fails
it as stale, which also expires its request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs
import orjson

from actors.files.confine import PathRefused, resolve
from actors.tools._permission import (
    EXTERNAL_DIRECTORY,
    Decision,
    Rule,
    decide,
    matches,
    strictest,
)
from actors.tools._shell_grammar import bash_subjects
from protocol.events import PermissionReply

__all__ = ["FILE_TOOLS", "Check", "PermissionWaiters", "judge", "summary"]

#: Tools whose ``path`` input is judged as a path (``"."`` when absent).
FILE_TOOLS: Final = frozenset({"read", "write", "edit", "list", "glob", "grep"})
#: Tools that may read a managed tool-output file without ``external_directory``.
_MANAGED_READERS: Final = frozenset({"read", "grep"})
SUMMARY_CHARS: Final = 500


@attrs.frozen(kw_only=True)
class Check:
    """One rule's answer for a call."""

    permission: str
    decision: Decision
    #: The subjects this rule judged ``ask`` (what a person is asked about).
    patterns: tuple[str, ...] = ()
    #: What an ``always`` reply allows for the rest of the session.
    always: tuple[str, ...] = ()
    #: Resolved paths outside the directory this check grants when it passes.
    external: tuple[Path, ...] = ()


def summary(tool: str, input: Mapping[str, Any]) -> str:
    """A short text of the call's input for a person to read."""
    if tool == "bash" and isinstance(input.get("command"), str):
        text = str(input["command"])
    elif tool in FILE_TOOLS and isinstance(input.get("path", "."), str):
        text = str(input.get("path", "."))
    else:
        text = orjson.dumps(dict(input), default=str).decode()
    return text if len(text) <= SUMMARY_CHARS else text[: SUMMARY_CHARS - 1] + "…"


def _granted(session_rules: Sequence[tuple[str, str]], permission: str, subject: str) -> bool:
    return any(p == permission and matches(pattern, subject) for p, pattern in session_rules)


def _check(
    rules: Mapping[str, Rule],
    session_rules: Sequence[tuple[str, str]],
    permission: str,
    subjects: Sequence[str | None],
    always: Mapping[str, str] | None = None,
) -> Check:
    decisions: list[Decision] = []
    asked: list[str] = []
    for subject in subjects:
        decision = decide(rules, permission, subject)
        key = subject if subject is not None else "*"
        if decision == "ask" and _granted(session_rules, permission, key):
            decision = "allow"
        if decision == "ask" and key not in asked:
            asked.append(key)
        decisions.append(decision)
    widened = tuple(dict.fromkeys((always or {}).get(s, s) for s in asked))
    return Check(
        permission=permission,
        decision=strictest(decisions),
        patterns=tuple(asked),
        always=widened,
    )


def judge(
    rules: Mapping[str, Rule],
    session_rules: Sequence[tuple[str, str]],
    tool: str,
    input: Mapping[str, Any],
    *,
    directory: Path,
    output_dir: Path,
) -> list[Check]:
    """The checks ``tool(input)`` must pass, in order. Blocking: it resolves paths."""
    checks: list[Check] = []
    subjects: list[str | None] = [None]
    unresolved: tuple[str, ...] = ()
    if tool == "bash" and isinstance(input.get("command"), str):
        parsed = bash_subjects(str(input["command"]))
        subjects, unresolved = list(parsed.commands), parsed.unresolved
    elif tool in FILE_TOOLS and isinstance(input.get("path", "."), str):
        location = directory.resolve()
        raw = str(input.get("path", "."))
        try:
            target = resolve(location, raw)
        except PathRefused:
            target = None  # the tool itself refuses it as invalid input
        if target is not None:
            if target.is_relative_to(location):
                subjects = [target.relative_to(location).as_posix() or "."]
            else:
                subjects = [str(target)]
                managed = (
                    tool in _MANAGED_READERS
                    and target.parent == output_dir.resolve()
                    and target.name.startswith("tool_")
                )
                if not managed:
                    folder = target if target.is_dir() else target.parent
                    check = _check(
                        rules,
                        session_rules,
                        EXTERNAL_DIRECTORY,
                        [str(target)],
                        {str(target): f"{folder}/*"},
                    )
                    checks.append(attrs.evolve(check, external=(target,)))
    check = _check(rules, session_rules, tool, subjects)
    line = str(input.get("command"))
    if unresolved and check.decision == "allow" and not _granted(session_rules, tool, line):
        # What it runs cannot be known from the text: a person decides.
        check = attrs.evolve(check, decision="ask", patterns=(line,), always=(line,))
    checks.append(check)
    return checks


class PermissionWaiters:
    """The tool calls of this process waiting for an answer, by permission id.

    One entry per waiting call, removed when it stops waiting: bounded by the
    calls in flight.
    """

    def __init__(self) -> None:
        self._waiting: dict[str, asyncio.Future[PermissionReply]] = {}

    def register(self, permission_id: str) -> asyncio.Future[PermissionReply]:
        future: asyncio.Future[PermissionReply] = asyncio.get_running_loop().create_future()
        self._waiting[permission_id] = future
        return future

    def discard(self, permission_id: str) -> None:
        self._waiting.pop(permission_id, None)

    def resolve(self, permission_id: str, reply: PermissionReply) -> bool:
        """Wake the call waiting for ``permission_id``; False if none waits here."""
        future = self._waiting.pop(permission_id, None)
        if future is None or future.done():
            return False
        future.set_result(reply)
        return True

    def __len__(self) -> int:
        return len(self._waiting)
