"""Pure renderers: the baseline, a change and a removal of each kind of source.

A source key's namespace picks its renderer. The baseline renders the
epoch's initial values in the fixed source order; an update renders each
changed key once, at admission, and the text is frozen in the event.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson

__all__ = ["ORDER", "render_baseline", "render_change", "render_removal", "sort_keys"]

#: The declared order of the sources: built-ins, discovery, skills,
#: references, MCP guidance, API entries.
ORDER: Final = ("builtin/agent", "builtin/", "discovery/", "skill/", "reference/", "mcp/", "api/")


def _rank(key: str) -> tuple[int, str]:
    for i, prefix in enumerate(ORDER):
        if key == prefix or (prefix.endswith("/") and key.startswith(prefix)):
            return i, key
    return len(ORDER), key


def sort_keys(keys: Any) -> list[str]:
    return sorted(keys, key=_rank)


def _json(value: Any) -> str:
    if isinstance(value, str):
        return value
    return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()


def _files(value: Any) -> str:
    return "\n\n".join(f"Instructions from: {f['path']}\n{f['text']}" for f in value)


def _block(key: str, value: Any) -> str:
    """A value's own text, as the baseline shows it."""
    if key == "builtin/agent":
        return str(value)
    if key == "builtin/environment":
        return (
            "<env>\n"
            f"  Working directory: {value['directory']}\n"
            f"  Platform: {value['platform']}\n"
            f"  Today's date: {value['date']}\n"
            "</env>"
        )
    if key.startswith("discovery/"):
        return _files(value)
    if key.startswith("skill/"):
        lines = "\n".join(f"- {s['name']}: {s['description']}" for s in value)
        return f"Skills you may load with the skill tool:\n{lines}"
    if key.startswith("reference/"):
        return f"Reference {value['path']}:\n{value['text']}"
    if key.startswith("api/"):
        return f'<context key="{key.removeprefix("api/")}">\n{_json(value)}\n</context>'
    if key.startswith("mcp/"):
        return f"Guidance from MCP server {key.removeprefix('mcp/')}:\n{value}"
    return _json(value)


def render_baseline(values: Mapping[str, Any]) -> str:
    return "\n\n".join(_block(k, values[k]) for k in sort_keys(values))


def render_change(key: str, value: Any, *, new: bool) -> str:
    if key.startswith("api/"):
        name = key.removeprefix("api/")
        head = (
            f'Context under "{name}" now applies:'
            if new
            else f'The context under "{name}" was replaced:'
        )
        return f"{head}\n{_block(key, value)}"
    if key == "builtin/agent":
        return f"Your instructions changed. They are now:\n{_block(key, value)}"
    if key == "builtin/environment":
        return f"The environment changed:\n{_block(key, value)}"
    if key.startswith("discovery/"):
        return f"The project instructions changed. The complete current set:\n{_block(key, value)}"
    if key.startswith("skill/"):
        return f"The available skills changed.\n{_block(key, value)}"
    if key.startswith("mcp/"):
        return f"The MCP server's guidance changed.\n{_block(key, value)}"
    return f"Updated {key}:\n{_block(key, value)}"


def render_removal(key: str) -> str:
    if key.startswith("api/"):
        return f'The context under "{key.removeprefix("api/")}" no longer applies.'
    if key.startswith("discovery/"):
        return "The previously loaded project instructions no longer apply."
    if key.startswith("skill/"):
        return "No skills are available any more."
    if key == "builtin/agent":
        return "Your previous agent instructions no longer apply."
    return f"The instructions under {key} no longer apply."
