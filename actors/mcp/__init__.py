"""MCP servers: their tools offered as ``<server>_<tool>``, their guidance an instruction source.

- :class:`McpServerConfig`, :func:`parse_servers`, :func:`narrow_servers`:
  the ``[mcp.<name>]`` tables (``_config``).
- :class:`McpServers`: the owner of every server connection (one per
  configuration and Location), their tools for a step, their guidance,
  their status (``_servers``).
- :class:`McpTool`: one server tool as a :class:`~actors.tools.Tool` (``_tool``).

The official ``mcp`` SDK (the ``sessionrt[mcp]`` extra) is imported only by
``_connection``, when the first configured server starts.
"""

from actors.mcp._config import (
    DEFAULT_TIMEOUT_MS,
    McpServerConfig,
    narrow_servers,
    parse_servers,
)
from actors.mcp._servers import GUIDANCE_PREFIX, McpServers
from actors.mcp._tool import McpTool, tool_name

__all__ = [
    "DEFAULT_TIMEOUT_MS",
    "GUIDANCE_PREFIX",
    "McpServerConfig",
    "McpServers",
    "McpTool",
    "narrow_servers",
    "parse_servers",
    "tool_name",
]
