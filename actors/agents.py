"""Agents: named configurations a session runs under.

An agent has a model (optional: the session's selected model, else the
built-in scripted model, is used), a step allowance (``steps``; absent means
unlimited), a system prompt, tool permissions (tool name, ``"*"``,
``external_directory`` or the ``config`` capability -> ``allow``/``ask``/``deny``
or a table of patterns to those, see :mod:`actors.tools._permission`) and,
for the scripted model, an optional ``script``.

Configuration is TOML. Two owners, two powers:

- **The operator's**: the built-in agents (``build``, ``plan``, and the
  ``general`` subagent) and the data
  directory's ``agents.toml``, which overrides them field by field and may
  define more agents, with any permissions.
- **The project's**: ``.sessionrt/agents.toml`` in the session's Location.
  It may add agents and change an operator agent's system prompt, model or
  script, but it can only take authority away: its permissions are
  :func:`~actors.tools._permission.narrow`-ed under a *ceiling*, and its
  ``steps`` can only lower the ceiling's. The ceiling of a project agent that
  shadows an operator agent is that agent; the ceiling of a new project agent
  is the operator's ``build``. So ``bash = "allow"`` for ``plan`` in a
  project file leaves bash denied, and no project file grants ``config``.

::

    [agents.build]
    steps = 25
    system = "You are a careful engineer."
    model = { id = "scripted", providerID = "scripted" }
    # instruction sources: files of the session's directory, skills it may use
    references = ["docs/style.md"]
    skills = ["release"]

    compaction = false          # automatic compaction off for this agent

    [agents.build.permissions]
    bash = { "git *" = "allow", "rm *" = "ask", "*" = "deny" }
    edit = "ask"
    external_directory = { "/srv/shared/*" = "allow" }

    [agents.reviewer]           # a subagent: reached only through the task tool
    mode = "subagent"           # primary | subagent | all (default)
    description = "Reviews a change and lists its problems"

    [agents.demo]
    script = '''
    #text Looking around.
    #tool list {"path": "."}
    #step
    #text Done.
    '''
"""

from __future__ import annotations

import asyncio
import functools
import time
import tomllib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal

import attrs

from actors.files.confine import PROJECT_CONFIG_DIR
from actors.tools._permission import Rule, narrow, validate_rule
from protocol import codec
from protocol.errors import InvalidRequestError
from protocol.shapes import ModelRef

__all__ = [
    "AGENT_MODES",
    "CATALOG_TTL_S",
    "DEFAULT_AGENT",
    "Agent",
    "AgentCatalog",
    "AgentCatalogs",
    "AgentMode",
    "load_catalog",
    "project_file",
]

DEFAULT_AGENT: Final = "build"
AgentMode = Literal["primary", "subagent", "all"]
AGENT_MODES: Final = ("primary", "subagent", "all")
#: How long a Location's catalog is reused before its files are read again.
CATALOG_TTL_S: Final = 1.0
PROJECT_FILE: Final = Path(PROJECT_CONFIG_DIR) / "agents.toml"


@attrs.frozen(kw_only=True)
class Agent:
    name: str
    model: ModelRef | None = None
    steps: int | None = None
    system: str = ""
    permissions: Mapping[str, Rule] = attrs.field(factory=lambda: {"*": "allow"})
    script: str | None = None
    #: Automatic compaction for sessions of this agent; None follows
    #: ``[runtime] compaction``.
    compaction: bool | None = None
    #: Files (relative to the session's directory) whose text is an instruction source.
    references: tuple[str, ...] = ()
    #: Skills the agent may use; None = every skill found.
    skills: tuple[str, ...] | None = None
    #: ``primary`` (a session's agent), ``subagent`` (only through the
    #: ``task`` tool) or ``all`` (either).
    mode: AgentMode = "all"
    #: What the agent is for, as the ``task`` tool lists it.
    description: str = ""


_BUILTIN: Final[dict[str, Agent]] = {
    "build": Agent(
        name="build",
        system=(
            "You are sessionrt's build agent. Work in the session's directory with the"
            " tools you are given, and say what you did."
        ),
        mode="primary",
    ),
    "plan": Agent(
        name="plan",
        system="You are sessionrt's planning agent. Read and propose; do not change files.",
        # No task either: a subagent's own permissions would let it write for plan.
        permissions={"*": "allow", "write": "deny", "edit": "deny", "bash": "deny", "task": "deny"},
        mode="primary",
    ),
    "general": Agent(
        name="general",
        system=(
            "You are sessionrt's general-purpose subagent. Do the task you are given with"
            " the tools you have, then answer with what you found or did: your last"
            " message is all the calling agent sees."
        ),
        mode="subagent",
        description=(
            "General-purpose agent for researching questions and carrying out"
            " multi-step tasks on its own"
        ),
    ),
}


@attrs.frozen
class AgentCatalog:
    agents: Mapping[str, Agent]

    def get(self, name: str | None) -> Agent:
        """The named agent, or the default one when ``name`` is ``None``.

        Raises:
            InvalidRequestError: ``name`` is not an agent of this catalog (field
                ``agent``). Never a fallback to the default: a typo of ``plan``
                must not run with ``build``'s tools.
        """
        if name is None:
            return self.agents.get(DEFAULT_AGENT) or Agent(name=DEFAULT_AGENT)
        if name not in self.agents:
            raise InvalidRequestError(
                f"unknown agent {name!r} (known: {', '.join(self.names())})", field="agent"
            )
        return self.agents[name]

    def names(self) -> list[str]:
        return sorted(self.agents)


class AgentCatalogs:
    """The catalog of each Location, read on a worker thread and reused briefly.

    Built-in agents, then the operator's ``files``, then the Location's
    project file (bounded by them). The files are re-read at most once per
    :data:`CATALOG_TTL_S` per Location, so an edit applies within a second
    without a thread hop on every use; a name the cached catalog lacks is
    looked up in a fresh read before it is refused, so an agent just added
    is known at once.
    """

    def __init__(
        self,
        files: Sequence[Path],
        blocking: Callable[[Callable[[], AgentCatalog]], Awaitable[AgentCatalog]],
    ) -> None:
        self._files = tuple(files)
        self._blocking = blocking
        # By the Location's directory as given (a step asks once or twice; a
        # path built for each ask was most of the cost of a cache hit).
        self._cache: dict[str, tuple[float, AgentCatalog]] = {}
        #: The read under way per Location, which a caller that finds the entry
        #: expired waits for instead of starting its own: when the TTL ran out
        #: under 100 stepping sessions, each of them sent the same read to a
        #: thread. None when that read failed or its reader was cancelled (the
        #: waiter then reads for itself). As many as Locations being read.
        self._reading: dict[str, asyncio.Future[AgentCatalog | None]] = {}

    async def load(self, directory: str, *, fresh: bool = False) -> AgentCatalog:
        now = time.monotonic()
        cached = self._cache.get(directory)
        if not fresh and cached is not None and now - cached[0] < CATALOG_TTL_S:
            return cached[1]
        reading = self._reading.get(directory)
        if reading is not None and not fresh:
            # Shielded: a waiter that gives up must not end the others' wait.
            joined = await asyncio.shield(reading)
            if joined is not None:
                return joined
        # A fresh read is its own (a read already under way may have begun
        # before the file the caller looks for was written).
        done: asyncio.Future[AgentCatalog | None] = asyncio.get_running_loop().create_future()
        if not fresh:
            self._reading[directory] = done
        catalog = None
        try:
            catalog = await self._blocking(
                functools.partial(load_catalog, *self._files, project=project_file(directory))
            )
        finally:
            done.set_result(catalog)
            if self._reading.get(directory) is done:
                del self._reading[directory]
        if len(self._cache) >= 256:
            self._cache.clear()  # many Locations: keep the cache bounded
        self._cache[directory] = (now, catalog)
        return catalog

    async def agent(self, directory: str, name: str | None) -> Agent:
        """``name`` in ``directory``'s catalog; see :meth:`AgentCatalog.get`."""
        catalog = await self.load(directory)
        if name is not None and name not in catalog.agents:
            catalog = await self.load(directory, fresh=True)
        return catalog.get(name)


def load_catalog(*files: Path, project: Path | None = None) -> AgentCatalog:
    """The operator's agents (built-ins, then each of ``files``), then ``project``'s.

    Blocking I/O. A missing file is skipped; see the module docstring for
    what a project file may and may not change.
    """
    agents = dict(_BUILTIN)
    for path in files:
        for name, table in _tables(path):
            agents[name] = _merge(agents.get(name), name, table, path)
    operator = dict(agents)
    if project is not None:
        for name, table in _tables(project):
            ceiling = operator.get(name) or operator.get(DEFAULT_AGENT) or Agent(name=name)
            agents[name] = _bounded(_merge(operator.get(name), name, table, project), ceiling)
    return AgentCatalog(agents=agents)


def _tables(path: Path) -> list[tuple[str, Any]]:
    if not path.is_file():
        return []
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InvalidRequestError(f"cannot read agents from {path}: {exc}") from None
    section = document.get("agents", {})
    if not isinstance(section, dict):
        raise InvalidRequestError(f"{path}: [agents] must be a table")
    return list(section.items())


def _bounded(agent: Agent, ceiling: Agent) -> Agent:
    """``agent`` with no more authority than ``ceiling``: permissions and steps."""
    steps = agent.steps
    if ceiling.steps is not None:
        steps = ceiling.steps if steps is None else min(steps, ceiling.steps)
    return attrs.evolve(
        agent, permissions=narrow(ceiling.permissions, agent.permissions), steps=steps
    )


def project_file(directory: str | Path) -> Path:
    return Path(directory) / PROJECT_FILE


_RULES_HELP: Final = (
    "permissions map tool names to allow, ask, deny, or a table of patterns to those"
)


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
        if "compaction" in table:
            if not isinstance(table["compaction"], bool):
                raise InvalidRequestError("compaction must be true or false", field="compaction")
            fields["compaction"] = table["compaction"]
        if "mode" in table:
            if table["mode"] not in AGENT_MODES:
                raise InvalidRequestError(
                    f"mode must be one of {', '.join(AGENT_MODES)}", field="mode"
                )
            fields["mode"] = table["mode"]
        for key in ("system", "script", "description"):
            if key in table:
                if not isinstance(table[key], str):
                    raise InvalidRequestError(f"{key} must be a string", field=key)
                fields[key] = table[key]
        for key in ("references", "skills"):
            if key in table:
                items = table[key]
                if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
                    raise InvalidRequestError(f"{key} must be a list of strings", field=key)
                fields[key] = tuple(items)
        if "permissions" in table:
            rules = table["permissions"]
            if not isinstance(rules, dict) or any(isinstance(v, tuple) for v in rules.values()):
                raise InvalidRequestError(_RULES_HELP, field="permissions")
            try:
                parsed = {str(k): validate_rule(v) for k, v in rules.items()}
            except ValueError:
                raise InvalidRequestError(_RULES_HELP, field="permissions") from None
            fields["permissions"] = {**current.permissions, **parsed}
    except InvalidRequestError as exc:
        raise InvalidRequestError(f"{path}: agents.{name}: {exc.message}") from None
    return attrs.evolve(current, **fields)
