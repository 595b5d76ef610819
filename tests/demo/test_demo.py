"""`make demo` on its embedded default: node agents publish, the extender schedules over HTTP."""

from __future__ import annotations

from pathlib import Path

import pytest

from demo.__main__ import main
from demo.cluster import DEFAULT_NODES, build_cluster
from extender.config import ExtenderConfig
from topology.catalog import SHARED_ENV


def test_the_demo_schedules_a_mixed_stream_and_reports(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--once", "--pods", "60"]) == 0  # more than fit: some wait
    out = capsys.readouterr().out
    assert "Scheduled " in out and "through HTTP filter/prioritize/bind" in out
    assert "hgx-h100-0" in out and "NV18 450 GB/s" in out
    assert "fragmentation" in out
    assert "/debug/topology/hgx-h100-0" in out  # one node's page
    assert "kubectl linkpack explain demo/" in out  # how to ask why a pod waits


def test_the_demo_cluster_builds_without_the_shared_data_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A bare clone has no shared reference folder: the demo's machines ship with the package."""
    monkeypatch.setenv(SHARED_ENV, str(tmp_path / "no-shared"))
    _, nodes = build_cluster(ExtenderConfig())
    assert [n.name for n in nodes] == [name for name, _ in DEFAULT_NODES]
