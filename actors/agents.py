"""Agents: named configurations a session runs under.

An agent has a model (optional: the session's selected model, else the
built-in scripted model, is used), a step allowance (``steps``; absent means
unlimited), a system prompt, tool permissions (tool name or ``"*"`` ->
``allow``/``deny``) and, for the scripted model, an optional ``script``.

Configuration is TOML, read from the data directory's ``agents.toml`` and then
from the project's ``.sessionrt/agents.toml`` (the session's Location); later
files override earlier ones field by field, on top of the built-in agents::

    [agents.build]
    steps = 25
    system = "You are a careful engineer."
    model = { id = "scripted", providerID = "scripted" }

    [agents.build.permissions]
    bash = "deny"

    [agents.demo]
    script = '''
    #text Looking around.
    #tool list {"path": "."}
    #step
    #text Done.
    '''
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Literal

import attrs

from protocol import codec
from protocol.errors import InvalidRequestError
from protocol.shapes import ModelRef

__all__ = ["DEFAULT_AGENT", "Agent", "AgentCatalog", "load_catalog", "project_file"]

DEFAULT_AGENT: Final = "build"
PROJECT_FILE: Final = Path(".sessionrt") / "agents.toml"

Decision = Literal["allow", "deny"]


@attrs.frozen(kw_only=True)
class Agent:
    name: str
    model: ModelRef | None = None
    steps: int | None = None
    system: str = ""
    permissions: Mapping[str, Decision] = attrs.field(factory=lambda: {"*": "allow"})
    script: str | None = None


_BUILTIN: Final[dict[str, Agent]] = {
    "build": Agent(
        name="build",
        system=(
            "You are sessionrt's build agent. Work in the session's directory with the"
            " tools you are given, and say what you did."
        ),
    ),
    "plan": Agent(
        name="plan",
        system="You are sessionrt's planning agent. Read and propose; do not change files.",
        permissions={"*": "allow", "write": "deny", "edit": "deny", "bash": "deny"},
    ),
}


@attrs.frozen
class AgentCatalog:
    agents: Mapping[str, Agent]

    def get(self, name: str | None) -> Agent:
        """The named agent; an unknown or absent name falls back to the default."""
        if name is not None and name in self.agents:
            return self.agents[name]
        return self.agents.get(DEFAULT_AGENT) or Agent(name=DEFAULT_AGENT)

    def names(self) -> list[str]:
        return sorted(self.agents)


def load_catalog(*files: Path) -> AgentCatalog:
    """Built-in agents overridden by each existing TOML file in turn (blocking I/O)."""
    agents = dict(_BUILTIN)
    for path in files:
        if not path.is_file():
            continue
        try:
            document = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise InvalidRequestError(f"cannot read agents from {path}: {exc}") from None
        section = document.get("agents", {})
        if not isinstance(section, dict):
            raise InvalidRequestError(f"{path}: [agents] must be a table")
        for name, table in section.items():
            agents[name] = _merge(agents.get(name), name, table, path)
    return AgentCatalog(agents=agents)


def project_file(directory: str | Path) -> Path:
    return Path(directory) / PROJECT_FILE


def _merge(base: Agent | None, name: str, table: Any, path: Path) -> Agent:
    if not isinstance(table, dict):
        raise InvalidRequestError(f"{path}: agents.{name} must be a table")
    current = base or Agent(name=name)
    fields: dict[str, Any] = {}
    try:
        if "model" in table:
            fields["model"] = codec.from_json(ModelRef, table["model"], path="model")
        if "steps" in table:
            steps = table["steps"]
            if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
                raise InvalidRequestError("steps must be a positive integer", field="steps")
            fields["steps"] = steps
        for key in ("system", "script"):
            if key in table:
                if not isinstance(table[key], str):
                    raise InvalidRequestError(f"{key} must be a string", field=key)
                fields[key] = table[key]
        if "permissions" in table:
            rules = table["permissions"]
            if not isinstance(rules, dict) or any(
                v not in ("allow", "deny") for v in rules.values()
            ):
                raise InvalidRequestError(
                    "permissions map tool names to allow or deny", field="permissions"
                )
            fields["permissions"] = {**current.permissions, **rules}
    except InvalidRequestError as exc:
        raise InvalidRequestError(f"{path}: agents.{name}: {exc.message}") from None
    return attrs.evolve(current, **fields)
