"""What every benchmark script does the same way: its entry point and its targets block.

Imported by the ``bench_*.py`` scripts next to it (a script's own directory is
first on ``sys.path``).
"""

from __future__ import annotations

import faulthandler
import json
import math
from collections.abc import Callable, Sequence
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))])


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


def target_lines(
    targets: list[dict[str, Any]], show: Callable[[Any, str], str], *, heading: str
) -> list[str]:
    """The informational PASS/FAIL/SKIP block that ends every benchmark's table."""
    lines = [heading]
    for target in targets:
        verdict = {True: "PASS", False: "FAIL", None: "SKIP"}[target["pass"]]
        lines.append(f"  [{verdict}] {target['name']}: {show(target['value'], target['unit'])}")
    return [line.rstrip() for line in lines]
