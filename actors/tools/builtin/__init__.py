"""The built-in tools, confined to the session's Location.

- ``read``, ``write``, ``edit``, ``list`` (``_files``)
- ``glob``, ``grep`` (``_search``)
- ``bash`` (``_bash``)

Path confinement and the confined directory walk live in ``_paths``.
"""

from actors.tools._types import Tool
from actors.tools.builtin._bash import DEFAULT_MAX_TIMEOUT_S, DEFAULT_OUTPUT_MEMORY_BYTES, BashTool
from actors.tools.builtin._files import EditTool, ListTool, ReadTool, WriteTool
from actors.tools.builtin._search import GlobTool, GrepTool

__all__ = [
    "DEFAULT_MAX_TIMEOUT_S",
    "DEFAULT_OUTPUT_MEMORY_BYTES",
    "BashTool",
    "EditTool",
    "GlobTool",
    "GrepTool",
    "ListTool",
    "ReadTool",
    "WriteTool",
    "builtin_tools",
]


def builtin_tools(*, bash: BashTool | None = None) -> tuple[Tool, ...]:
    """A fresh instance of every built-in tool, in a stable order (``bash`` as given)."""
    return (
        ReadTool(),
        WriteTool(),
        EditTool(),
        ListTool(),
        GlobTool(),
        GrepTool(),
        bash or BashTool(),
    )
