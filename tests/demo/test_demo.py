"""`make demo` on its embedded default: node agents publish, the extender schedules over HTTP."""

from __future__ import annotations

import pytest

from demo.__main__ import main


def test_the_demo_schedules_a_mixed_stream_and_reports(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--once", "--pods", "30"]) == 0
    out = capsys.readouterr().out
    assert "Scheduled " in out and "through HTTP filter/prioritize/bind" in out
    assert "hgx-h100-0" in out and "NV18 450 GB/s" in out
    assert "fragmentation" in out
