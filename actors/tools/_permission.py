"""Per-agent tool permission: a rule table mapping tool names (or ``*``) to a decision.

Besides tool names, a table may hold *capabilities* that ``*`` never grants,
because they are not tools a model picks but authority over the runtime
itself; they are ``deny`` unless named:

- ``config``: tools may write the project's configuration (``.sessionrt/``).

:func:`narrow` is the one way two tables combine when one of them may only
take authority away (a project's ``agents.toml`` below the operator's).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal

__all__ = ["CAPABILITIES", "Decision", "narrow", "permission"]

Decision = Literal["allow", "deny"]

#: Rule keys that ``*`` does not cover (see the module docstring).
CAPABILITIES: Final = frozenset({"config"})
#: How restrictive each decision is; the stricter one wins in :func:`narrow`.
_STRICTNESS: Final[Mapping[str, int]] = {"allow": 0, "deny": 1}


def permission(agent_rules: Mapping[str, Decision], tool_name: str) -> Decision:
    """Whether an agent may call ``tool_name`` (or hold a capability).

    An exact name wins over ``"*"``; with neither present the answer is
    ``"allow"`` — except for a capability, which is ``"deny"`` unless named.
    Only allowed tools are offered to the model; a declined call is the
    caller's to fail (as ``permission.denied``), without running it.

    Raises:
        ValueError: the deciding rule is neither ``"allow"`` nor ``"deny"``.
    """
    if tool_name in CAPABILITIES:
        decision = agent_rules.get(tool_name, "deny")
    else:
        decision = agent_rules.get(tool_name, agent_rules.get("*", "allow"))
    if decision not in _STRICTNESS:
        raise ValueError(f"permission rule for {tool_name!r} must be 'allow' or 'deny'")
    return decision


def narrow(ceiling: Mapping[str, Decision], rules: Mapping[str, Decision]) -> dict[str, Decision]:
    """A table deciding, for every name, the stricter of ``ceiling`` and ``rules``.

    ``rules`` can deny what ``ceiling`` allows, never the reverse. Every name
    either table mentions is decided explicitly; any other name falls to
    ``*``, which is itself the stricter of the two ``*`` decisions, so the
    result holds for names neither table mentions too.
    """
    out: dict[str, Decision] = {}
    for name in {*ceiling, *rules, "*"}:
        a, b = permission(ceiling, name), permission(rules, name)
        out[name] = a if _STRICTNESS[a] >= _STRICTNESS[b] else b
    return out
