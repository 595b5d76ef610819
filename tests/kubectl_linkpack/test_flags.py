"""`kubectl linkpack` takes its global flags before or after the command, as kubectl does."""

from __future__ import annotations

import pytest

from contract.keys import DEFAULT_NAMESPACE
from kubectl_linkpack.cli import parser


@pytest.mark.parametrize(
    "argv",
    [
        ["--kubeconfig", "k.yaml", "--context", "lab", "nodes"],
        ["nodes", "--kubeconfig", "k.yaml", "--context", "lab"],
        ["--kubeconfig", "k.yaml", "nodes", "--context", "lab"],
    ],
)
def test_global_flags_are_read_before_or_after_the_command(argv: list[str]) -> None:
    """Wherever the flags stand, the command sees the same kubeconfig and context."""
    args = parser().parse_args(argv)
    assert (args.command, args.kubeconfig, args.context) == ("nodes", "k.yaml", "lab")
    assert args.system_namespace == DEFAULT_NAMESPACE and args.units_per_gpu is None


def test_a_flag_before_the_command_is_not_reset_by_the_commands_own_parser() -> None:
    """Flags not repeated after the command keep the values given before it."""
    args = parser().parse_args(["--system-namespace", "gpu-ops", "--units-per-gpu", "50", "explain", "ml/p"])
    assert (args.system_namespace, args.units_per_gpu, args.pod) == ("gpu-ops", 50, "ml/p")


def test_a_bad_value_after_the_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        parser().parse_args(["pods", "--units-per-gpu", "0"])
    assert stopped.value.code == 2
    assert "must be positive" in capsys.readouterr().err
