"""Tools: what a model can call, how a call runs, and how its output is bounded.

- :class:`Tool`, :class:`ToolContext`, :class:`ToolResult`, :class:`ToolError`,
  :class:`ToolOutcome`: the values of one call (``_types``).
- :class:`ToolRegistry`, :class:`ToolSpec`: tools by name, specs for a model
  request, input validation against each tool's JSON Schema (``_registry``).
- :func:`permission`: an agent's allow/deny rule table (``_permission``).
- :func:`tool_environment`: the server's environment without its secrets,
  for every subprocess a tool starts (``_environment``).
- :class:`ToolExecutor`: validate → run on a call actor → bound, as one
  settled :class:`ToolOutcome` (``_executor``).
- :class:`ToolActors`, :class:`ToolOwner`: each local call on one of at most
  ``limit`` pooled pykka call actors (each with its worker thread), owned by
  its step (Run / Cancel / Progress) (``_actors``).
- :class:`OutputBounding`, :func:`run_sweeper`: the 2,000-line / 50 KiB limit,
  managed output files and their 7-day retention (``_bounding``).
- :func:`tool`, :class:`CallContext`, :class:`FunctionTool`: a typed Python
  function (sync or async) as a tool, for embedding applications (``_python``).
- :mod:`actors.tools.builtin`: read, write, edit, list, glob, grep, bash.
"""

from actors.tools._actors import (
    Cancel,
    Progress,
    Run,
    ToolActors,
    ToolCallActor,
    ToolChild,
    ToolOwner,
)
from actors.tools._bounding import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_LINES,
    DEFAULT_RETENTION_DAYS,
    SWEEP_INTERVAL_S,
    OutputBounding,
    run_sweeper,
)
from actors.tools._environment import PASSWORD_ENV, is_secret, tool_environment
from actors.tools._executor import RecordProcess, ToolExecutor
from actors.tools._permission import Decision, permission
from actors.tools._process import ProcessGroup
from actors.tools._python import CallContext, FunctionTool, ToolSchemaError, tool
from actors.tools._registry import ToolRegistry, ToolSpec
from actors.tools._types import (
    DEFAULT_BASH_TIMEOUT_S,
    AsyncTool,
    CancelEvent,
    Content,
    SucceededThenInterrupted,
    Tool,
    ToolContext,
    ToolError,
    ToolOutcome,
    ToolResult,
    ToolStatus,
    text_item,
)
from actors.tools.builtin import builtin_tools

__all__ = [
    "DEFAULT_BASH_TIMEOUT_S",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_LINES",
    "DEFAULT_RETENTION_DAYS",
    "PASSWORD_ENV",
    "SWEEP_INTERVAL_S",
    "AsyncTool",
    "CallContext",
    "Cancel",
    "CancelEvent",
    "Content",
    "Decision",
    "FunctionTool",
    "OutputBounding",
    "ProcessGroup",
    "Progress",
    "RecordProcess",
    "Run",
    "SucceededThenInterrupted",
    "Tool",
    "ToolActors",
    "ToolCallActor",
    "ToolChild",
    "ToolContext",
    "ToolError",
    "ToolExecutor",
    "ToolOutcome",
    "ToolOwner",
    "ToolRegistry",
    "ToolResult",
    "ToolSchemaError",
    "ToolSpec",
    "ToolStatus",
    "builtin_tools",
    "is_secret",
    "permission",
    "run_sweeper",
    "text_item",
    "tool",
    "tool_environment",
]
