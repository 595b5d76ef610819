"""Node labels end to end: node agents label their nodes, plain nodeAffinity places GPU pods.

One installation for the module: four fake GPU nodes (no kubelet), each with a node agent
process in simulate mode on a captured machine (DGX A100 and DGX-1 V100: SXM with NVLink; PCIe
cards with NVLink bridge pairs; RTX 3090s without NVLink), the extender as its own process and
kube-scheduler running the shipped configuration. The V100 node is created with the product
label GPU Feature Discovery would give it ("Tesla-V100-SXM2-32GB"), which differs from the
simulated name: the agent must leave it, report it and label the rest.

Pods carry the seed's affinity example (manifests/examples/pod-sxm-affinity.yaml: required
`topology.kubernetes.io/nvidia-sxm: "true"`, preferred `nvidia.com/gpu.nvlink: "true"`) plus a
node selector on this module's nodes, and the checks read where the API says they were bound.
"""

from __future__ import annotations

import contextlib
import copy
import json
import uuid as uuidlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from contract.keys import GROUP, MANAGED_LABELS_ANNOTATION, TOPOLOGY_PLURAL, TOPOLOGY_VERSION
from tests.cluster.controlplane import (
    REPO_ROOT,
    ControlPlane,
    delete_fake_node,
    load_manifest,
    temporary_namespace,
)
from tests.cluster.linkpack_env import running_extender, scheduler_config, wait_until
from tests.cluster.test_node_agent_e2e import AgentProcess, running_agent
from tests.support.resources import GPU, SHARED

pytestmark = pytest.mark.cluster

EXAMPLE = REPO_ROOT / "manifests" / "examples" / "pod-sxm-affinity.yaml"
GFD_PRODUCT = "Tesla-V100-SXM2-32GB"  # what GFD labels a DGX-1V's GPUs; the simulation says "V100-SXM2-32GB"
SETTLE_S = 30


@dataclass(frozen=True)
class Installation:
    cp: ControlPlane
    group: str  # the value of linkpack.io/e2e-group on this module's nodes
    nodes: dict[str, str]  # role -> node name
    agents: dict[str, AgentProcess]  # node name -> its agent

    def core(self) -> Any:
        return client.CoreV1Api(self.cp.api_client())

    def labels(self, node: str) -> dict[str, str]:
        return dict(self.core().read_node(node).metadata.labels or {})

    def status(self, node: str) -> dict[str, Any]:
        custom = client.CustomObjectsApi(self.cp.api_client())
        try:
            obj = custom.get_cluster_custom_object(GROUP, TOPOLOGY_VERSION, TOPOLOGY_PLURAL, node)
        except ApiException as exc:
            if exc.status == 404:
                return {}
            raise
        return dict(obj.get("status") or {})


ROLES = {  # role -> captured machine
    "a100": "dgx-a100",
    "v100": "dgx1-v100",
    "pairs": "pcie-nv12-pairs",
    "3090": "rtx3090-2socket",
}


@pytest.fixture(scope="module")
def installation(linkpack_crd: ControlPlane) -> Iterator[Installation]:
    cp = linkpack_crd
    suffix = uuidlib.uuid4().hex[:5]
    group = f"labels-{suffix}"
    nodes = {role: f"lbl-{role}-{suffix}" for role in ROLES}
    with contextlib.ExitStack() as stack:
        for role, node in nodes.items():
            labels = {"kubernetes.io/hostname": node, "linkpack.io/e2e-group": group}
            if role == "v100":
                labels["nvidia.com/gpu.product"] = GFD_PRODUCT  # GFD was here first
            cp.create_fake_node(node, {GPU: "8", SHARED: "800"}, labels=labels)
            stack.callback(_delete_node, cp, node)
        agents = {
            node: stack.enter_context(running_agent(cp, node, ["--no-device-plugin"], machine=ROLES[role]))
            for role, node in nodes.items()
        }
        found = Installation(cp, group, nodes, agents)
        for node in nodes.values():
            wait_until(
                lambda node=node: (
                    "linkpack.io/nvlink-clique" in found.labels(node) and found.status(node).get("gpuHealth")
                ),
                SETTLE_S,
                f"the agent to label {node} and publish its GpuTopology",
            )
        extender = stack.enter_context(running_extender(cp, name="extender-labels"))
        cp.start_scheduler(scheduler_config(cp, extender.url, extender.tls))
        stack.callback(cp.stop_scheduler)
        yield found


def _delete_node(cp: ControlPlane, node: str) -> None:
    with contextlib.suppress(ApiException):
        client.CustomObjectsApi(cp.api_client()).delete_cluster_custom_object(
            GROUP, TOPOLOGY_VERSION, TOPOLOGY_PLURAL, node
        )
    delete_fake_node(cp.api_client(), node)


@pytest.fixture
def namespace(installation: Installation) -> Iterator[str]:
    """A namespace for a test's pods; after it, the extender has released their GPUs again."""
    with temporary_namespace(installation.cp.api_client(), prefix="labels-") as name:
        yield name
    core = installation.core()

    def released() -> bool:
        maps = core.list_namespaced_config_map("linkpack-system", label_selector="linkpack.io/ledger=true")
        return all(f'"namespace":"{name}"' not in (m.data or {}).get("ledger", "") for m in maps.items)

    wait_until(released, 60, f"the ledgers to release the pods of {name}")


def _example_pod(name: str, group: str, gpus: int, example: Path = EXAMPLE) -> dict[str, Any]:
    """The shipped example pod, renamed, asking for `gpus`, kept to this module's nodes."""
    pod = copy.deepcopy(yaml.safe_load(example.read_text()))
    pod["metadata"] = {"name": name}
    container = pod["spec"]["containers"][0]
    container["resources"] = {
        "limits": {GPU: str(gpus)},
        "requests": {GPU: str(gpus)},
    }
    container["image"] = "registry.invalid/app:1"
    pod["spec"]["nodeSelector"] = {"linkpack.io/e2e-group": group}
    return dict(pod)


def _node_of(inst: Installation, namespace: str, name: str) -> str:
    return str(inst.core().read_namespaced_pod(name, namespace).spec.node_name or "")


def _bound(inst: Installation, namespace: str, name: str, what: str) -> str:
    wait_until(lambda: _node_of(inst, namespace, name) != "", 90, what)
    return _node_of(inst, namespace, name)


def _scheduling_failures(inst: Installation, namespace: str, name: str) -> str:
    events = inst.core().list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
    return " ".join(e.message or "" for e in events if e.reason == "FailedScheduling")


# ---------------------------------------------------------------------- the labels


@pytest.mark.timeout(120)
def test_the_example_passes_server_side_validation(linkpack_crd: ControlPlane) -> None:
    """manifests/examples/pod-sxm-affinity.yaml is admitted as it ships (dryRun=All, nothing stored)."""
    objects = load_manifest(EXAMPLE)
    assert [o["kind"] for o in objects] == ["Pod"] and objects[0]["spec"]["schedulerName"] == "linkpack"
    assert [o["kind"] for o in linkpack_crd.create_objects(objects, dry_run=True)] == ["Pod"]


@pytest.mark.timeout(300)
def test_each_node_is_labelled_from_its_hardware(installation: Installation) -> None:
    """SXM, NVLink, NVSwitch, the clique, the GPU count and the driver land on each node as the agent saw them."""
    inst = installation
    expected = {  # role -> (nvidia-sxm, nvlink, nvswitch, clique)
        "a100": ("true", "true", "true", "8"),
        "v100": ("true", "true", "false", "4"),
        "pairs": ("false", "true", "false", "2"),
        "3090": ("false", "false", "false", "1"),
    }
    for role, (sxm, nvlink, nvswitch, clique) in expected.items():
        labels = inst.labels(inst.nodes[role])
        seen = (
            labels["topology.kubernetes.io/nvidia-sxm"],
            labels["nvidia.com/gpu.nvlink"],
            labels["nvidia.com/gpu.nvswitch"],
            labels["linkpack.io/nvlink-clique"],
        )
        assert seen == (sxm, nvlink, nvswitch, clique), role
        assert labels["nvidia.com/gpu.count"] == "8"
        assert (labels["nvidia.com/cuda.driver.major"], labels["nvidia.com/cuda.runtime.minor"]) == (
            "550",
            "4",
        )
        assert labels["linkpack.io/mps"] == "false"
        record = json.loads(
            inst.core().read_node(inst.nodes[role]).metadata.annotations[MANAGED_LABELS_ANNOTATION]
        )
        assert "linkpack.io/e2e-group" not in record and "kubernetes.io/hostname" not in record
        assert record["linkpack.io/nvlink-clique"] == clique
    a100 = inst.labels(inst.nodes["a100"])
    assert (a100["nvidia.com/gpu.product"], a100["nvidia.com/gpu.memory"]) == ("A100-SXM4-40GB", "40960")
    status = inst.status(inst.nodes["a100"])
    assert status["driver"] == {"version": "550.54.15", "cudaVersion": "12.4"}
    assert {p["limitW"] for p in status["gpuPower"]} == {400} and len(status["gpuPower"]) == 8


@pytest.mark.timeout(300)
def test_a_conflicting_label_is_left_alone_and_reported(installation: Installation) -> None:
    """GFD's product label on the V100 node stays; the status and a LabelConflict event say so."""
    inst = installation
    node = inst.nodes["v100"]
    labels = inst.labels(node)
    assert labels["nvidia.com/gpu.product"] == GFD_PRODUCT
    assert labels["topology.kubernetes.io/nvidia-sxm"] == "true"  # the rest is labelled all the same
    record = json.loads(inst.core().read_node(node).metadata.annotations[MANAGED_LABELS_ANNOTATION])
    assert "nvidia.com/gpu.product" not in record
    conflicts = inst.status(node).get("labelConflicts") or []
    assert len(conflicts) == 1 and "nvidia.com/gpu.product" in conflicts[0] and GFD_PRODUCT in conflicts[0]

    def reported() -> bool:
        events = (
            inst.core().list_namespaced_event("default", field_selector=f"involvedObject.name={node}").items
        )
        return any(e.reason == "LabelConflict" and GFD_PRODUCT in (e.message or "") for e in events)

    wait_until(reported, SETTLE_S, f"a LabelConflict event on {node}")
    assert inst.agents[node].proc.poll() is None  # and the agent keeps running


# ---------------------------------------------------------------------- placing pods with them


@pytest.mark.timeout(300)
def test_the_sxm_affinity_example_lands_only_on_sxm_nodes(installation: Installation, namespace: str) -> None:
    """Pods with the example's affinity fill the two SXM nodes; one more waits although PCIe nodes are free."""
    inst = installation
    sxm_nodes = {inst.nodes["a100"], inst.nodes["v100"]}
    core = inst.core()
    core.create_namespaced_pod(namespace, _example_pod("sxm-0", inst.group, 8))
    first = _bound(inst, namespace, "sxm-0", "the first SXM pod bound")
    core.create_namespaced_pod(namespace, _example_pod("sxm-1", inst.group, 8))
    second = _bound(inst, namespace, "sxm-1", "the second SXM pod bound")
    assert {first, second} == sxm_nodes
    for node in (first, second):
        assert inst.labels(node)["nvidia.com/gpu.nvlink"] == "true"  # the preferred term holds there too
    core.create_namespaced_pod(namespace, _example_pod("sxm-2", inst.group, 8))
    wait_until(
        lambda: "didn't match Pod's node affinity/selector" in _scheduling_failures(inst, namespace, "sxm-2"),
        90,
        "the third SXM pod refused by node affinity",
    )
    assert _node_of(inst, namespace, "sxm-2") == ""


@pytest.mark.timeout(300)
def test_plain_affinity_on_the_other_labels(installation: Installation, namespace: str) -> None:
    """NVLink without SXM finds the bridged PCIe node; a clique above 4 finds the NVSwitch node."""
    inst = installation
    core = inst.core()
    bridged = _example_pod("bridged", inst.group, 2)
    bridged["spec"]["affinity"] = _required(
        {"key": "topology.kubernetes.io/nvidia-sxm", "operator": "In", "values": ["false"]},
        {"key": "nvidia.com/gpu.nvlink", "operator": "In", "values": ["true"]},
    )
    core.create_namespaced_pod(namespace, bridged)
    assert _bound(inst, namespace, "bridged", "the NVLink-without-SXM pod bound") == inst.nodes["pairs"]
    wide = _example_pod("wide", inst.group, 1)
    wide["spec"]["affinity"] = _required(
        {"key": "linkpack.io/nvlink-clique", "operator": "Gt", "values": ["4"]}
    )
    core.create_namespaced_pod(namespace, wide)
    assert _bound(inst, namespace, "wide", "the wide-clique pod bound") == inst.nodes["a100"]


def _required(*expressions: dict[str, Any]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": list(expressions)}]
            }
        }
    }
