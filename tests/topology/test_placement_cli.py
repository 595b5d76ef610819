"""`python -m topology place`: JSON out, exit 0 placed / 1 misfit / 2 bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from topology.placement_cli import main

# 4 PCIe GPUs with NVLink bridges on (0,2) and (1,3), two sockets.
BRIDGED_PAIRS = """\
\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
GPU0\t X \tSYS\tNV12\tSYS\t0-31\t0\t\tN/A
GPU1\tSYS\t X \tSYS\tNV12\t0-31\t0\t\tN/A
GPU2\tNV12\tSYS\t X \tSYS\t0-31\t0\t\tN/A
GPU3\tSYS\tNV12\tSYS\t X \t0-31\t0\t\tN/A
"""


@pytest.fixture
def matrix(tmp_path: Path) -> Path:
    path = tmp_path / "bridged.txt"
    path.write_text(BRIDGED_PAIRS)
    return path


def test_a_placement_prints_the_gpus_and_the_score(matrix: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(matrix), "--gpus", "1", "--used", "0", "--model", "A100 PCIe"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["gpus"] == [2]
    assert doc["score"]["leftover_gbps"] == 300.0
    assert "uuids" not in doc  # `topo -m` output names no UUIDs: none are made up


def test_a_pair_is_the_bridged_pair(matrix: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(matrix), "--gpus", "2", "--model", "A100 PCIe"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["gpus"], doc["score"]["bottleneck_gbps"]) == ([0, 2], 300.0)


def test_a_misfit_prints_the_reason_and_exits_1(matrix: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(matrix), "--gpus", "5"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert (doc["reason"], doc["resolvable"]) == ("TOO_FEW_GPUS", False)


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["--gpus", "2", "--used", "7"], id="used GPU out of range"),
        pytest.param(["--gpus", "2", "--used", "x"], id="used GPU not a number"),
    ],
)
def test_bad_gpu_lists_exit_2(matrix: Path, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(matrix), *argv]) == 2
    assert capsys.readouterr().err.startswith("error:")


def test_unreadable_or_unparseable_files_exit_2(tmp_path: Path) -> None:
    assert main([str(tmp_path / "missing.txt"), "--gpus", "1"]) == 2
    garbage = tmp_path / "garbage.txt"
    garbage.write_text("not a matrix\n")
    assert main([str(garbage), "--gpus", "1"]) == 2
