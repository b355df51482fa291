"""Per-agent tool permission: a rule table mapping tool names (or ``*``) to a decision."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

__all__ = ["Decision", "permission"]

Decision = Literal["allow", "deny"]


def permission(agent_rules: Mapping[str, Decision], tool_name: str) -> Decision:
    """Whether an agent may call ``tool_name``.

    An exact name wins over ``"*"``; with neither present the answer is
    ``"allow"``. A declined call is the caller's to fail (as ``aborted``).

    Raises:
        ValueError: the deciding rule is neither ``"allow"`` nor ``"deny"``.
    """
    decision = agent_rules.get(tool_name, agent_rules.get("*", "allow"))
    if decision not in ("allow", "deny"):
        raise ValueError(f"permission rule for {tool_name!r} must be 'allow' or 'deny'")
    return decision
