"""`nvidia-smi topo -m` is run with a timeout and fails with messages an operator can act on."""

from __future__ import annotations

import subprocess

import pytest

from node_agent.sources.smi_runner import SmiError, SmiNotFound, run_topo_matrix
from tests.support.machines import topo_text


def _runner(stdout: str = "", stderr: str = "", code: int = 0, raises: BaseException | None = None):
    calls = []

    def run(argv, **kwargs):
        calls.append((argv, kwargs))
        if raises is not None:
            raise raises
        return subprocess.CompletedProcess(argv, code, stdout, stderr)

    return run, calls


def _which(name: str) -> str:
    return f"/usr/bin/{name}"


def test_success_returns_the_matrix_and_uses_a_timeout():
    """A successful run returns the matrix and is bounded by the timeout."""
    run, calls = _runner(stdout=topo_text("hgx-h100"))
    assert run_topo_matrix(timeout_s=7, runner=run, which=_which) == topo_text("hgx-h100")
    argv, kwargs = calls[0]
    assert argv == ["/usr/bin/nvidia-smi", "topo", "-m"] and kwargs["timeout"] == 7 and not kwargs["check"]


def test_missing_binary():
    """A missing nvidia-smi is SmiNotFound, saying how to do without it."""
    with pytest.raises(SmiNotFound, match="not found on PATH"):
        run_topo_matrix(which=lambda name: None)


@pytest.mark.parametrize(
    ("runner", "message"),
    [
        (_runner(raises=subprocess.TimeoutExpired("nvidia-smi", 15))[0], "did not finish within 15s"),
        (_runner(raises=PermissionError(13, "Permission denied"))[0], "could not start"),
        (
            _runner(
                code=9, stdout="NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
            )[0],
            "exited with status 9: NVIDIA-SMI has failed",
        ),
        (_runner(stdout="No devices were found\n")[0], "printed no GPU matrix: No devices were found"),
        (_runner(code=1)[0], "exited with status 1: no output"),
    ],
)
def test_failures_explain_themselves(runner, message):
    """Timeouts, start failures, exit codes and empty output each explain themselves."""
    with pytest.raises(SmiError, match=message):
        run_topo_matrix(runner=runner, which=_which)
