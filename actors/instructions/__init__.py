"""Instructions as value deltas: sources, values, rendering, API entries.

See :mod:`actors.instructions._sources` for what is observed and
:mod:`actors.instructions._render` for what the model reads. Their admission
at a step boundary is the session's drain's
(:mod:`actors.session.instruction_admission`).
"""

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
    "DISABLE_PROJECT_CONFIG_ENV",
    "DISCOVERY_KEY",
    "ENTRY_KEY",
    "ENTRY_MAX_BYTES",
    "KEY",
    "SKILLS_KEY",
    "InstructionEntries",
    "digest",
    "encode",
    "project_config_disabled",
    "reference_key",
    "render_baseline",
    "render_change",
    "render_removal",
]
