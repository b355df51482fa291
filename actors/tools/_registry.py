"""ToolRegistry: the tools a runtime offers, by name, with their input validators.

Schemas are checked when a tool is registered, so a broken schema fails at
start-up rather than on the model's first call, and each tool's validator is
built once.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final

import attrs
import jsonschema
import jsonschema.exceptions
import jsonschema.validators
from jsonschema.protocols import Validator

from actors.llm._request import ToolSpec
from actors.tools._permission import Rule, offered
from actors.tools._types import Tool, ToolError

__all__ = ["ToolRegistry", "ToolSpec"]

#: Permission tables whose offered tools a registry keeps (by count).
_OFFERED_ENTRIES: Final = 64


@attrs.frozen
class _Entry:
    tool: Tool
    validator: Validator
    #: As a model request describes it; made once (every step offers it).
    spec: ToolSpec


class ToolRegistry:
    """Tools by name, in registration order."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._entries: dict[str, _Entry] = {}
        #: :meth:`offered_specs` by the identity of the rules table asked with
        #: (the table is kept, so its id is not reused while the entry lives);
        #: at most :data:`_OFFERED_ENTRIES` tables, emptied when full or when a
        #: tool is registered.
        self._offered: dict[int, tuple[Mapping[str, Rule], tuple[ToolSpec, ...]]] = {}
        for tool in tools:
            self.register(tool)

    def __repr__(self) -> str:
        return f"<ToolRegistry {list(self._entries)}>"

    def register(self, tool: Tool) -> None:
        """Add ``tool``.

        Raises:
            ValueError: the name is taken, or the input schema is not a valid
                JSON Schema for an object.
        """
        if tool.name in self._entries:
            raise ValueError(f"a tool named {tool.name!r} is already registered")
        schema = tool.input_schema
        if schema.get("type") != "object":
            raise ValueError(f"tool {tool.name!r}: input_schema must have type 'object'")
        cls = jsonschema.validators.validator_for(schema)
        try:
            cls.check_schema(dict(schema))
        except jsonschema.exceptions.SchemaError as exc:
            raise ValueError(f"tool {tool.name!r}: invalid input_schema: {exc.message}") from exc
        spec = ToolSpec(name=tool.name, description=tool.description, input_schema=schema)
        self._entries[tool.name] = _Entry(tool, cls(dict(schema)), spec)
        self._offered.clear()

    def offered_specs(self, rules: Mapping[str, Rule]) -> tuple[ToolSpec, ...]:
        """Specs of the tools an agent with permission table ``rules`` may call
        (:func:`~actors.tools._permission.offered`), as a model request lists them.

        Asked at every step with the same few tables (an agent catalog keeps
        its agents), so the answer is kept per table.
        """
        kept = self._offered.get(id(rules))
        if kept is not None and kept[0] is rules:
            return kept[1]
        specs = tuple(e.spec for e in self._entries.values() if offered(rules, e.tool.name))
        if len(self._offered) >= _OFFERED_ENTRIES:
            self._offered.clear()
        self._offered[id(rules)] = (rules, specs)
        return specs

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[Tool]:
        return (entry.tool for entry in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, name: str) -> Tool | None:
        """The tool called ``name``, or ``None``."""
        entry = self._entries.get(name)
        return None if entry is None else entry.tool

    def lookup(self, name: str) -> Tool:
        """The tool called ``name``.

        Raises:
            ToolError: type ``unknown-tool``.
        """
        entry = self._entries.get(name)
        if entry is None:
            raise ToolError(_unknown(name, self._entries), type="unknown-tool")
        return entry.tool

    def specs(self, names: Iterable[str] | None = None) -> tuple[ToolSpec, ...]:
        """Specs for a model request: every tool, or those in ``names`` that exist."""
        wanted = None if names is None else set(names)
        return tuple(
            entry.spec
            for entry in self._entries.values()
            if wanted is None or entry.tool.name in wanted
        )

    def validate(self, name: str, input: Any) -> str | None:
        """Check ``input`` against the tool's schema: ``None`` if valid, else why not.

        Raises:
            ToolError: type ``unknown-tool``.
        """
        entry = self._entries.get(name)
        if entry is None:
            raise ToolError(_unknown(name, self._entries), type="unknown-tool")
        error = jsonschema.exceptions.best_match(entry.validator.iter_errors(input))
        if error is None:
            return None
        where = "" if not error.absolute_path else f" at {error.json_path}"
        return f"Invalid input for tool {name!r}{where}: {error.message}"


def _unknown(name: str, known: Mapping[str, object]) -> str:
    available = ", ".join(sorted(known)) or "none"
    return f"Unknown tool {name!r}; available tools: {available}"
