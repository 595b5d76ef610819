"""Child processes that cannot outlive the test run."""

from __future__ import annotations

import ctypes
import signal
import sys
import threading
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    if sys.platform != "linux":
        return None
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return prctl


_PRCTL = _load_prctl()  # looked up here: the child, after fork, should only call it


def _die_with_parent() -> None:
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` that has the kernel SIGKILL the child when the thread starting it ends
    (Linux), so a killed test run leaves no orphans; None where that is not possible or safe
    (PDEATHSIG follows the starting thread, so only the main thread uses it)."""
    if _PRCTL is None or threading.current_thread() is not threading.main_thread():
        return None
    return _die_with_parent
