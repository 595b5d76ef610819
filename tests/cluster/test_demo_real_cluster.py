"""`make demo` switched to a real cluster with --kubeconfig: the same report, from the API."""

from __future__ import annotations

import pytest
from kubernetes import client

from demo.__main__ import main
from demo.real_cluster import DEMO_NAMESPACE
from tests.cluster.controlplane import ControlPlane
from tests.cluster.linkpack_env import node_topology, publish_node

pytestmark = pytest.mark.cluster


def test_the_demo_drives_pods_on_a_real_cluster(
    linkpack_crd: ControlPlane, capsys: pytest.CaptureFixture[str]
) -> None:
    cp = linkpack_crd
    publish_node(cp, "demo-a100", node_topology("demo-a100", "dgx-a100"))
    try:
        assert main(["--once", "--pods", "12", "--kubeconfig", str(cp.kubeconfig_path)]) == 0
        out = capsys.readouterr().out
        assert "demo-a100" in out and "through HTTP filter/prioritize/bind" in out
        pods = client.CoreV1Api(cp.api_client()).list_namespaced_pod(DEMO_NAMESPACE).items
        assert sum(1 for p in pods if p.spec.node_name) >= 1
    finally:
        core = client.CoreV1Api(cp.api_client())
        core.delete_collection_namespaced_pod(DEMO_NAMESPACE, grace_period_seconds=0)
        core.delete_node("demo-a100")
        client.CustomObjectsApi(cp.api_client()).delete_cluster_custom_object(
            "linkpack.io", "v1alpha1", "gputopologies", "demo-a100"
        )
