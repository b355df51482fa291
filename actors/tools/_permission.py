"""Per-agent tool permission: a rule table from permission keys to decisions.

A table maps a *key* to a rule. Keys are tool names, globs over tool names
(``"files_*" = "ask"``: every tool of the MCP server ``files``; an exact name
wins over a glob, and of several matching globs the last written wins),
``*`` (every tool not named), and a few names that ``*`` never covers, because they are not tools a
model picks but authority over the runtime or the machine:

- ``config``: tools may write the project's configuration (``.sessionrt/``);
  ``deny`` unless named.
- ``external_directory``: file tools may touch a path outside the session's
  directory; ``ask`` unless named, as in OpenCode, where it defaults to ask.

A rule is a decision (``allow``, ``ask``, ``deny``) or a table of patterns
(``{"git *" = "allow", "rm *" = "ask"}``) matched against the call's
*subject* (the bash command; the path for file tools; the resolved absolute
path for ``external_directory``): the **last** matching pattern wins, and a
subject no pattern matches gets the table's ``*`` entry, which is the
table's fallback wherever it is written (so ``{"git *" = "allow", "*" = "ask"}``
allows ``git status`` and asks for the rest), else the key's default.
Patterns are globs: ``*`` matches any run of characters (``/`` and spaces
included), ``?`` one character; a pattern ending in
``" *"`` also matches its bare prefix (``git *`` matches ``git``).

:func:`narrow` is the one way two tables combine when one of them may only
take authority away (a project's ``agents.toml`` below the operator's): where
both name a key with plain decisions the stricter is kept; where either uses
patterns the key holds both rules, and a subject gets the stricter of their
two answers.

A bash command line is judged by the commands it runs, read with a shell
grammar (:mod:`actors.tools._shell_grammar`): ``git status && rm -rf x`` is
judged as ``git status`` and ``rm -rf x``, ``env FOO=1 /bin/rm x`` also as
``rm x``, and the most restrictive answer wins; a line whose commands cannot
be resolved is asked about. Only an allow-list bounds what bash may do.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from typing import Final, Literal, TypeAlias, cast

__all__ = [
    "CAPABILITIES",
    "DECISIONS",
    "EXTERNAL_DIRECTORY",
    "Decision",
    "Rule",
    "decide",
    "matches",
    "narrow",
    "offered",
    "permission",
    "strictest",
    "validate_rule",
]

Decision = Literal["allow", "ask", "deny"]
#: A decision, a pattern table, or (after :func:`narrow`) several rules of
#: which the strictest answer counts.
Rule: TypeAlias = "Decision | Mapping[str, Decision] | tuple[Rule, ...]"

DECISIONS: Final = ("allow", "ask", "deny")
EXTERNAL_DIRECTORY: Final = "external_directory"
#: Keys that ``*`` does not cover, with their default (see the module docstring).
CAPABILITIES: Final[Mapping[str, Decision]] = {"config": "deny", EXTERNAL_DIRECTORY: "ask"}
#: A key with one of these is a glob over tool names (``files_*``), not a name.
_GLOB_KEY: Final = frozenset("*?")
#: How restrictive each decision is; the stricter one wins.
_STRICTNESS: Final[Mapping[str, int]] = {"allow": 0, "ask": 1, "deny": 2}


def strictest(decisions: Iterable[Decision]) -> Decision:
    """The most restrictive of ``decisions`` (``allow`` for none)."""
    out: Decision = "allow"
    for decision in decisions:
        if _STRICTNESS[decision] > _STRICTNESS[out]:
            out = decision
    return out


def validate_rule(rule: object) -> Rule:
    """``rule`` if it is a decision or a table of patterns to decisions.

    Raises:
        ValueError: anything else.
    """
    if isinstance(rule, str) and rule in _STRICTNESS:
        return cast(Decision, rule)
    if isinstance(rule, Mapping) and all(
        isinstance(k, str) and isinstance(v, str) and v in _STRICTNESS for k, v in rule.items()
    ):
        return cast(Mapping[str, Decision], dict(rule))
    if isinstance(rule, tuple):
        return tuple(validate_rule(r) for r in rule)
    raise ValueError("a permission rule is allow, ask, deny, or a table of patterns to those")


@functools.lru_cache(maxsize=1024)
def _compiled(pattern: str) -> re.Pattern[str]:
    bare = pattern.endswith(" *")
    stem = pattern[:-2] if bare else pattern
    body = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in stem)
    return re.compile(body + ("(?: .*)?" if bare else ""), re.DOTALL)


def matches(pattern: str, subject: str) -> bool:
    """Whether the glob ``pattern`` matches the whole ``subject``."""
    return _compiled(pattern).fullmatch(subject) is not None


def _fallback(rules: Mapping[str, Rule], key: str) -> Rule:
    if key in CAPABILITIES:
        return rules.get(key, CAPABILITIES[key])
    found = rules.get(key)
    if found is not None:
        return found
    # A glob key (``files_*``: an MCP server's tools) covers the names it
    # matches; the last matching one wins, as patterns do.
    for name, rule in rules.items():
        if name != "*" and _GLOB_KEY.intersection(name) and matches(name, key):
            found = rule
    return found if found is not None else rules.get("*", "allow")


def _judge(rule: Rule, subject: str | None, default: Decision) -> Decision:
    if isinstance(rule, str):
        return rule
    if isinstance(rule, tuple):
        return strictest(_judge(r, subject, default) for r in rule)
    decision = rule.get("*", default)
    if subject is not None:
        for pattern, answer in rule.items():
            if pattern != "*" and matches(pattern, subject):
                decision = answer  # the last match wins (tables keep their order)
    return decision


def _default(rules: Mapping[str, Rule], key: str) -> Decision:
    if key in CAPABILITIES:
        return CAPABILITIES[key]
    star = rules.get("*", "allow")
    return star if isinstance(star, str) else "allow"


def decide(rules: Mapping[str, Rule], key: str, subject: str | None = None) -> Decision:
    """The decision for ``key`` applied to ``subject`` (see the module docstring).

    A pattern table asked without a subject answers with its ``*`` pattern
    (or the default).
    """
    return _judge(_fallback(rules, key), subject, _default(rules, key))


def permission(rules: Mapping[str, Rule], tool_name: str) -> Decision:
    """Whether an agent may call ``tool_name`` (or hold a capability), subject aside.

    Kept for plain tables: an exact name wins over ``"*"``; with neither the
    answer is ``"allow"``, except for a capability (see :data:`CAPABILITIES`).

    Raises:
        ValueError: the deciding rule is not a valid rule.
    """
    validate_rule(_fallback(rules, tool_name))
    return decide(rules, tool_name)


def _possible(rule: Rule, default: Decision) -> set[Decision]:
    if isinstance(rule, str):
        return {rule}
    if isinstance(rule, tuple):
        # Each part can only make the answer stricter: the least any part allows.
        parts = [_possible(r, default) for r in rule]
        floor = strictest(min(p, key=_STRICTNESS.__getitem__) for p in parts)
        return {floor}
    return {*rule.values(), rule.get("*", default)}


def offered(rules: Mapping[str, Rule], tool_name: str) -> bool:
    """Whether some call of ``tool_name`` may run (allowed, or after asking).

    Only these tools are offered to the model; a call that is then denied
    for its subject fails alone.
    """
    rule = _fallback(rules, tool_name)
    return any(d != "deny" for d in _possible(rule, _default(rules, tool_name)))


def narrow(ceiling: Mapping[str, Rule], rules: Mapping[str, Rule]) -> dict[str, Rule]:
    """A table deciding, for every key and subject, the stricter of ``ceiling`` and ``rules``.

    ``rules`` can deny what ``ceiling`` allows, never the reverse. Every key
    either table mentions is decided explicitly; any other falls to ``*``,
    which is itself the stricter of the two ``*`` rules.
    """
    out: dict[str, Rule] = {}
    for name in {*ceiling, *rules, "*"}:
        a, b = _fallback(ceiling, name), _fallback(rules, name)
        if isinstance(a, str) and isinstance(b, str):
            out[name] = strictest((a, b))
        else:
            out[name] = (a, b)
    return out
