"""Runs `nvidia-smi topo -m` (the only module of the agent that starts a process).

Returns the raw text for `topology.smi_parser`; every failure becomes `SmiError` with a
message an operator can act on (missing binary, driver not loaded, timeout).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Sequence
from typing import Any

DEFAULT_BINARY = "nvidia-smi"
DEFAULT_TIMEOUT_S = 15.0


class SmiError(Exception):
    """`nvidia-smi topo -m` did not produce a matrix."""


class SmiNotFound(SmiError):
    """The nvidia-smi binary is not installed or not on PATH."""


Runner = Callable[..., "subprocess.CompletedProcess[str]"]


def run_topo_matrix(
    binary: str = DEFAULT_BINARY,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    runner: Runner = subprocess.run,
    which: Callable[[str], str | None] = shutil.which,
) -> str:
    """The stdout of `nvidia-smi topo -m`; raises `SmiNotFound` / `SmiError`."""
    path = which(binary)
    if path is None:
        raise SmiNotFound(
            f"{binary!r} not found on PATH; install the NVIDIA driver utilities or pass --no-smi"
        )
    return _run(runner, [path, "topo", "-m"], timeout_s)


def _run(runner: Runner, argv: Sequence[str], timeout_s: float) -> str:
    command = " ".join(argv)
    kwargs: dict[str, Any] = {"capture_output": True, "text": True, "timeout": timeout_s, "check": False}
    try:
        done = runner(list(argv), **kwargs)
    except subprocess.TimeoutExpired as exc:
        raise SmiError(f"{command} did not finish within {timeout_s:g}s (driver hung or GPU lost?)") from exc
    except OSError as exc:
        raise SmiError(f"{command} could not start: {exc}") from exc
    if done.returncode != 0:
        detail = _tail(done.stderr or done.stdout or "")
        raise SmiError(f"{command} exited with status {done.returncode}: {detail or 'no output'}")
    if "GPU0" not in (done.stdout or ""):
        raise SmiError(f"{command} printed no GPU matrix: {_tail(done.stdout or '') or 'empty output'}")
    return str(done.stdout)


def _tail(text: str, limit: int = 400) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else "..." + text[-limit:]
