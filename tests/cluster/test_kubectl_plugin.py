"""`kubectl linkpack` against a real API server: GpuTopology objects, a ledger ConfigMap, a pod.

The objects are written the way the node agent and the extender write them (topology codec
spec, status through the subresource, ledger ConfigMap in linkpack-system, allocation
annotation carried by the Binding's pod); the plugin reads them back through its kubeconfig.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from contract.allocation import Allocation, encode_allocation
from contract.keys import ALLOCATION_ANNOTATION, LEDGER_LABEL, ledger_name
from contract.ledger import Ledger, LedgerEntry, encode_ledger
from kubectl_linkpack import cli as plugin
from tests.cluster.controlplane import ControlPlane, bind_pod, delete_fake_node, temporary_namespace
from tests.support.pods import api_pod_manifest
from tests.support.resources import GPU
from topology.catalog import load_machine
from topology.codec import encode_topology
from topology.scheduling import GpuGrant

pytestmark = pytest.mark.cluster

GROUP, VERSION, PLURAL = "linkpack.io", "v1alpha1", "gputopologies"
SYSTEM = "linkpack-system"
NODE = "plugin-a100"
TOPOLOGY = load_machine("dgx-a100")


@dataclass(frozen=True)
class Installed:
    cp: ControlPlane
    namespace: str
    kubeconfig: str


def _publish_topology(custom: Any) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GpuTopology",
        "metadata": {"name": NODE},
        "spec": encode_topology(TOPOLOGY),
    }
    custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, body)
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    health = [
        {"index": g.index, "uuid": g.uuid, "healthy": g.index != 6,
         "reason": "XID 79: GPU has fallen off the bus" if g.index == 6 else "", "cordoned": False}
        for g in TOPOLOGY.gpus
    ]  # fmt: skip
    status = {"heartbeat": now, "gpuCount": TOPOLOGY.gpu_count, "gpuHealth": health, "agentVersion": "test"}
    custom.patch_cluster_custom_object_status(
        GROUP, VERSION, PLURAL, NODE, {"status": status}, _content_type="application/merge-patch+json"
    )


@pytest.fixture(scope="module")
def installed(linkpack_crd: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    cp = linkpack_crd
    api = cp.api_client()
    core: Any = client.CoreV1Api(api)
    custom: Any = client.CustomObjectsApi(api)
    cp.create_fake_node(NODE, {GPU: "8"})
    _publish_topology(custom)
    with temporary_namespace(api, prefix="plugin-") as namespace:
        allocation = Allocation(
            NODE, tuple(GpuGrant(i, TOPOLOGY.gpus[i].uuid, True) for i in (0, 1)), 1,
            resources=((GPU, 2),),
        )  # fmt: skip
        annotations = {ALLOCATION_ANNOTATION: encode_allocation(allocation)}
        pod = api_pod_manifest("trainer", annotations=annotations, image="registry.invalid/x:1")
        uid = core.create_namespaced_pod(namespace, pod).metadata.uid
        assert bind_pod(api, namespace, "trainer", NODE, uid) == 201
        ledger = Ledger(NODE, (LedgerEntry(uid, namespace, "trainer", allocation, 1000.0),))
        config_map = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": ledger_name(NODE), "namespace": SYSTEM, "labels": {LEDGER_LABEL: "true"}},
            "data": encode_ledger(ledger),
        }
        core.create_namespaced_config_map(SYSTEM, config_map)
        try:
            yield Installed(cp, namespace, str(cp.kubeconfig_path))
        finally:
            with contextlib.suppress(ApiException):
                core.delete_namespaced_config_map(ledger_name(NODE), SYSTEM)
            with contextlib.suppress(ApiException):
                custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, NODE)
            delete_fake_node(api, NODE)


def _row(text: str, first: str) -> list[str]:
    return next(line.split() for line in text.splitlines() if line.startswith(first + " "))


def test_nodes_reads_topology_health_and_ledger(
    installed: Installed, capsys: pytest.CaptureFixture[str]
) -> None:
    assert plugin.main(["--kubeconfig", installed.kubeconfig, "nodes"]) == 0
    out = capsys.readouterr().out
    row = _row(out, NODE)
    # NODE MODEL GPUS FREE SHARED WHOLE UNHEALTHY CORDONED FREE-MEM PODS HEARTBEAT HEALTH...
    assert row[:10] == [
        NODE,
        "A100-SXM4-40GB",
        "8",
        "5",
        "0",
        "2",
        "1",
        "0",
        f"{5 * 40960 / 1024:.1f}Gi",
        "1",
    ]
    assert row[10].endswith("s") or row[10].endswith("m")
    assert " ".join(row[11:]) == "GPU6: XID 79: GPU has fallen off the bus"


def test_topo_prints_the_link_matrix(
    installed: Installed, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", installed.kubeconfig)  # credentials from the environment this time
    assert plugin.main(["topo", NODE]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Node {NODE}: 8 x A100-SXM4-40GB, NVSwitch (NV12 per GPU)\n")
    assert _row(out, "GPU0")[:4] == ["GPU0", "X", "NV12", "300"]
    assert (
        "  NIC9: mlx5_9" in out.splitlines()
        and "  GPU6: unhealthy (XID 79: GPU has fallen off the bus)" in out
    )
    assert plugin.main(["topo", "no-such-node"]) == 1
    assert "no GpuTopology named 'no-such-node'" in capsys.readouterr().err


def test_pods_matches_the_ledger_with_the_pod(
    installed: Installed, capsys: pytest.CaptureFixture[str]
) -> None:
    assert plugin.main(["--kubeconfig", installed.kubeconfig, "pods", "-n", installed.namespace]) == 0
    row = _row(capsys.readouterr().out, installed.namespace)
    assert row == [installed.namespace, "trainer", NODE, "0,1", "whole", "none", "bound"]


def test_explain_goes_through_the_service_proxy(
    installed: Installed, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No extender Service exists here: the API server's answer shows the proxy path (the debug
    port, with the caller's token) was right."""
    monkeypatch.setenv("LINKPACK_TOKEN", "a-token-for-the-debug-port")
    argv = ["--kubeconfig", installed.kubeconfig, "explain", "-n", installed.namespace, "trainer"]
    assert plugin.main([*argv, "--extender-url", ""]) == 1
    err = capsys.readouterr().err
    assert "through the service proxy of linkpack-system/https:linkpack-extender:debug" in err
    assert 'services "linkpack-extender" not found' in err
