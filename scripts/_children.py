"""Children that end with the process that started them.

``die_with_parent`` is a ``preexec_fn`` for :class:`subprocess.Popen`: the child
asks the kernel (``PR_SET_PDEATHSIG``) for a SIGKILL when the thread that forked
it ends, so a harness or a test process killed outright (SIGKILL, the OOM
killer) takes its servers with it instead of leaving them under init. Use it only
from a thread that lives as long as the child should (the main thread).
"""

from __future__ import annotations

import ctypes
import signal

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def die_with_parent() -> None:
    """In the forked child, before exec: SIGKILL me when my parent thread is gone."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
