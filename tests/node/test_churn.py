"""Churn and faults on the real node (`tests.node.churn`): waves of short whole-GPU, share and MIG
pods with graceful and forced deletions while the kubelet, the node agent and the extender restart.
Asserted: no admission rejection, no GPU held whole (nor MIG instance held) by two pods at once,
no cordoned or unhealthy GPU handed out, every container's environment matching the kubelet's
account and its record, every pod run. The report (with creation-to-Running times) is written to build/reports/."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.cluster.controlplane import REPO_ROOT, temporary_namespace
from tests.node.churn import ChurnPlan, markdown, run_churn
from tests.node.linkpack_stack import LinkpackStack, running_stack
from tests.node.real_node import RealNode

REPORT_DIR = REPO_ROOT / "build" / "reports"

pytestmark = [pytest.mark.cluster, pytest.mark.node, pytest.mark.churn, pytest.mark.timeout(900)]


@pytest.fixture
def churn_stack(real_node: RealNode) -> Iterator[LinkpackStack]:
    with running_stack(real_node) as running:
        yield running


def test_churn_with_restarts_and_forced_deletions(churn_stack: LinkpackStack) -> None:
    """Six waves of eight short pods (seed 7) with graceful and forced deletions and a kubelet,
    node agent and extender restart: every bound pod is admitted and the node's account agrees."""
    plan = ChurnPlan()
    with temporary_namespace(churn_stack.cp.api_client(), prefix="churn-") as namespace:
        report = run_churn(churn_stack, namespace, plan)
    text = markdown(report, plan)
    REPORT_DIR.mkdir(parents=True, exist_ok=True)
    (REPORT_DIR / "node-churn.md").write_text(text + "\n")
    (REPORT_DIR / "node-churn.json").write_text(json.dumps(report.summary(), indent=1) + "\n")
    print("\n" + text)
    assert report.admission_rejections == 0, report.rejected
    assert report.double_holds == 0, report.double_hold_examples
    assert report.unavailable_handed_out == 0
    assert report.env_mismatches == 0, report.env_mismatch_examples
    assert report.never_ran == [], report.never_ran
    assert report.env_checked > 0
