"""Children that end with the process that started them.

A child asks the kernel (``PR_SET_PDEATHSIG``) for a SIGKILL when the thread
that forked it ends, so a harness or a test process killed outright (SIGKILL,
the OOM killer) takes its servers with it instead of leaving them under init.
Use it only from a thread that lives as long as the child should (the main
thread).

It is set by running the command through util-linux's ``setpriv --pdeathsig``,
which sets it and then execs the command in the same process. A ``preexec_fn``
would do the same, but it makes ``subprocess`` fork the whole parent instead of
``vfork``-ing it: 70 ms a spawn from a test worker's heap, against 1 ms.
Without ``setpriv`` the command runs as given.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence

_SETPRIV = shutil.which("setpriv")


def die_with_parent(args: Sequence[str]) -> list[str]:
    """``args`` run so that the child is SIGKILLed when its parent thread is gone."""
    if _SETPRIV is None:
        return list(args)
    return [_SETPRIV, "--pdeathsig", "KILL", "--", *args]
