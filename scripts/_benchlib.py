"""What every benchmark script's entry point does the same way.

Imported by the ``bench_*.py`` scripts next to it (a script's own directory is
first on ``sys.path``).
"""

from __future__ import annotations

import faulthandler
import json
from collections.abc import Callable
from typing import Any


def report_main(
    produce: Callable[[], dict[str, Any]],
    render: Callable[[dict[str, Any]], str],
    *,
    as_json: bool,
    hard_limit_s: float,
) -> int:
    """Produce the report under a hang guard, then print it as JSON or a table."""
    # Last-resort guard against a hang: dump every thread's stack and exit.
    faulthandler.dump_traceback_later(hard_limit_s, exit=True)
    try:
        report = produce()
    finally:
        faulthandler.cancel_dump_traceback_later()
    print(json.dumps(report, indent=2) if as_json else render(report))
    return 0
