"""Instructions as value deltas: sources, admission, the baseline, API entries.

See :mod:`actors.instructions._admission` for the boundary rules,
:mod:`actors.instructions._sources` for what is observed and
:mod:`actors.instructions._render` for what the model reads.
"""

from actors.instructions._admission import (
    BASELINE_CACHE_BYTES,
    Instructions,
    InstructionsUnavailableError,
)
from actors.instructions._render import render_baseline, render_change, render_removal
from actors.instructions._sources import (
    DISABLE_PROJECT_CONFIG_ENV,
    DISCOVERY_KEY,
    SKILLS_KEY,
    project_config_disabled,
    reference_key,
)
from actors.instructions._values import ENTRY_KEY, ENTRY_MAX_BYTES, KEY, digest, encode
from actors.instructions.entries import InstructionEntries

__all__ = [
    "BASELINE_CACHE_BYTES",
    "DISABLE_PROJECT_CONFIG_ENV",
    "DISCOVERY_KEY",
    "ENTRY_KEY",
    "ENTRY_MAX_BYTES",
    "KEY",
    "SKILLS_KEY",
    "InstructionEntries",
    "Instructions",
    "InstructionsUnavailableError",
    "digest",
    "encode",
    "project_config_disabled",
    "reference_key",
    "render_baseline",
    "render_change",
    "render_removal",
]
