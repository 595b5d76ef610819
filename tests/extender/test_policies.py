"""GpuSchedulingPolicy objects: chosen by pod, namespace or cluster default, applied to the next
decision, refused with a reason naming the policy; and the CUDA version a pod needs."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from contract.allocation import decode_allocation
from contract.gpu_topology import as_published
from contract.keys import ALLOCATION_ANNOTATION, CUDA_VERSION_ANNOTATION, GPU_POWER_ANNOTATION
from extender.config import ExtenderConfig
from extender.kube.in_memory import InMemoryCluster
from extender.service import ExtenderService, handlers_for
from extender.state.snapshot import NodeFacts
from tests.support.machines import hgx_h100, rtx3090_two_socket
from tests.support.pods import filter_args, pod_manifest

pytestmark = pytest.mark.timeout(60)
NODES = ["nv-node", "pcie-node"]


def policy(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "linkpack.io/v1alpha1",
        "kind": "GpuSchedulingPolicy",
        "metadata": {"name": name},
        "spec": spec,
    }


def _published(name: str, topology: Any, cuda: str = "", driver: str = "") -> Any:
    published = as_published(name, topology)
    return replace(
        published, status=replace(published.status, cuda_driver_version=cuda, driver_version=driver)
    )


@pytest.fixture
def cluster(config: ExtenderConfig) -> InMemoryCluster:
    c = InMemoryCluster(config)
    c.add_node(NodeFacts("nv-node"), _published("nv-node", hgx_h100(), "12.4", "550.54.15"))
    c.add_node(NodeFacts("pcie-node"), _published("pcie-node", rtx3090_two_socket(), "12.2", "535.104.05"))
    return c


@pytest.fixture
def service(config: ExtenderConfig, cluster: InMemoryCluster) -> ExtenderService:
    svc = ExtenderService(config, cluster)
    cluster.run_watches(handlers_for(svc), lambda: True)
    return svc


def _filter(service: ExtenderService, pod: dict[str, Any]) -> dict[str, Any]:
    return service.filter(filter_args(pod, NODES))


def test_a_pod_names_a_policy_and_its_requirements_hold(
    service: ExtenderService, cluster: InMemoryCluster
) -> None:
    """A policy requiring NVSwitch keeps its pods off the PCIe node, with the reason naming the policy."""
    cluster.put_policy(policy("fabric", topology={"requireNvswitch": True}))
    result = _filter(service, pod_manifest(gpus=2, policy="fabric"))
    assert result["NodeNames"] == ["nv-node"]
    assert "requires NVSwitch" in result["FailedAndUnresolvableNodes"]["pcie-node"]
    assert "fabric" in result["FailedAndUnresolvableNodes"]["pcie-node"]


def test_a_namespace_default_and_the_cluster_default_apply_in_order(
    service: ExtenderService, cluster: InMemoryCluster
) -> None:
    """Without an annotation the namespace's policy decides; without that, the policy named default."""
    cluster.put_policy(policy("default", allowedGpuModels=["NVIDIA GeForce RTX 3090"]))
    cluster.put_policy(policy("fabric", topology={"requireNvswitch": True}))
    assert _filter(service, pod_manifest(gpus=1))["NodeNames"] == ["pcie-node"]  # the cluster default
    cluster.set_namespace_policy("ml", "fabric")
    assert _filter(service, pod_manifest(gpus=1))["NodeNames"] == ["nv-node"]  # the namespace's
    pinned = pod_manifest(gpus=1, policy="balanced")  # a built-in, named by the pod
    assert _filter(service, pinned)["NodeNames"] == NODES


def test_an_unknown_or_invalid_policy_is_an_unresolvable_reason_naming_it(
    service: ExtenderService, cluster: InMemoryCluster
) -> None:
    """A policy object that fails validation, or a name no policy has, fails every node with a reason
    naming the policy and what is wrong; nothing is placed or changed."""
    cluster.put_policy(policy("broken", weights={"packing": -3}))
    before = service.store.snapshot().ledgers()
    broken = _filter(service, pod_manifest(gpus=1, policy="broken"))
    assert broken["NodeNames"] == []
    reason = broken["FailedAndUnresolvableNodes"]["nv-node"]
    assert "GpuSchedulingPolicy 'broken'" in reason and "weights.packing" in reason
    unknown = _filter(service, pod_manifest(gpus=1, policy="nope"))["FailedAndUnresolvableNodes"]["nv-node"]
    assert "unknown linkpack.io/policy 'nope'" in unknown and "broken" in unknown and "balanced" in unknown
    assert service.store.snapshot().ledgers() == before


def test_a_policy_change_applies_to_the_next_decision_not_to_a_committed_one(
    service: ExtenderService, cluster: InMemoryCluster
) -> None:
    """Tightening a policy changes where the next pod may go; the allocation already made stays."""
    cluster.put_policy(policy("team", allowedGpuModels=["NVIDIA GeForce RTX 3090"]))
    first = cluster.create_pod(pod_manifest("first", gpus=1, policy="team"))
    assert _filter(service, first)["NodeNames"] == ["pcie-node"]
    meta = first["metadata"]
    assert service.bind(
        {"PodName": "first", "PodNamespace": "ml", "PodUID": meta["uid"], "Node": "pcie-node"}
    ) == {"Error": ""}
    cluster.put_policy(policy("team", allowedGpuModels=["NVIDIA H100 80GB HBM3"]))
    assert _filter(service, pod_manifest("second", gpus=1, policy="team"))["NodeNames"] == ["nv-node"]
    kept = decode_allocation(
        cluster.read_pod("ml", "first").manifest["metadata"]["annotations"][ALLOCATION_ANNOTATION]
    )
    assert kept.node == "pcie-node"


def test_sharing_defaults_give_memory_per_unit(service: ExtenderService, cluster: InMemoryCluster) -> None:
    """A share asking units only gets the policy's memory per unit, and the cap lands in the record."""
    cluster.put_policy(policy("default", sharing={"memoryPerUnitMiB": 512}))
    pod = cluster.create_pod(pod_manifest("units-only", units=10))
    meta = pod["metadata"]
    assert service.bind(
        {"PodName": "units-only", "PodNamespace": "ml", "PodUID": meta["uid"], "Node": "nv-node"}
    ) == {"Error": ""}
    allocation = decode_allocation(
        cluster.read_pod("ml", "units-only").manifest["metadata"]["annotations"][ALLOCATION_ANNOTATION]
    )
    assert allocation.grants[0].memory_mib == 5120 and allocation.grants[0].units == 10


def test_explain_says_which_policy_decided_and_why(
    service: ExtenderService, cluster: InMemoryCluster
) -> None:
    """The explanation names the policy and where it came from (here: the pod's namespace)."""
    from fastapi.testclient import TestClient

    from extender.serving.app import create_app

    cluster.put_policy(policy("fabric", topology={"requireNvswitch": True}))
    cluster.set_namespace_policy("ml", "fabric")
    created = cluster.create_pod(pod_manifest("explained", gpus=1))
    _filter(service, created)
    doc = TestClient(create_app(service)).get("/debug/explain/ml/explained").json()
    assert doc["request"]["policy"]["name"] == "fabric"
    assert doc["request"]["policySource"] == "namespace ml"


def test_a_pod_needing_a_newer_cuda_than_a_driver_runs_is_kept_off_it(
    service: ExtenderService, cluster: InMemoryCluster
) -> None:
    """A pod needing CUDA 12.4 passes the 12.4 node and is refused by the 12.2 one, the reason
    naming both versions; a policy's cudaVersion is the default for its pods."""
    result = _filter(service, pod_manifest(gpus=1, annotations={CUDA_VERSION_ANNOTATION: "12.4"}))
    assert result["NodeNames"] == ["nv-node"]
    assert result["FailedAndUnresolvableNodes"]["pcie-node"].endswith(
        "driver 535.104.05 runs CUDA up to 12.2, the pod needs 12.4"
    )
    cluster.put_policy(policy("new-cuda", cudaVersion="12.3"))
    assert _filter(service, pod_manifest(gpus=1, policy="new-cuda"))["NodeNames"] == ["nv-node"]
    bad = _filter(service, pod_manifest(gpus=1, annotations={CUDA_VERSION_ANNOTATION: "twelve"}))
    assert "linkpack.io/cuda-version 'twelve'" in bad["FailedAndUnresolvableNodes"]["nv-node"]


def _with_power(published: Any, limit: int, low: int, high: int) -> Any:
    from contract.gpu_topology import GpuPower

    power = tuple(GpuPower(g.index, limit, low, high) for g in published.topology.gpus)
    return replace(published, status=replace(published.status, gpu_power=power))


def test_power_budgets_are_placed_within_each_gpus_limit(config: ExtenderConfig) -> None:
    """Whole GPUs take a budget their limit can be set to; shares of one GPU add up to at most its
    limit; an impossible budget is refused naming the range, and an unknown limit is refused too."""
    cluster = InMemoryCluster(config)
    cluster.add_node(NodeFacts("powered"), _with_power(as_published("powered", hgx_h100()), 700, 200, 700))
    cluster.add_node(NodeFacts("unknown"), as_published("unknown", rtx3090_two_socket()))
    service = ExtenderService(config, cluster)
    cluster.run_watches(handlers_for(service), lambda: True)
    nodes = ["powered", "unknown"]

    def bind(name: str, **ask: Any) -> str:
        watts = ask.pop("watts")
        pod = cluster.create_pod(pod_manifest(name, annotations={GPU_POWER_ANNOTATION: str(watts)}, **ask))
        meta = pod["metadata"]
        passed = service.filter(filter_args(pod, nodes))
        if not passed["NodeNames"]:
            return passed["FailedAndUnresolvableNodes"].get("powered") or passed["FailedNodes"]["powered"]
        reply = service.bind(
            {"PodName": name, "PodNamespace": "ml", "PodUID": meta["uid"], "Node": passed["NodeNames"][0]}
        )
        return reply["Error"] or passed["NodeNames"][0]

    assert bind("too-low", gpus=1, watts=15).endswith("15 W asked, the GPUs allow 200-700 W")
    assert bind("whole", gpus=2, watts=300) == "powered"
    record = decode_allocation(
        cluster.read_pod("ml", "whole").manifest["metadata"]["annotations"][ALLOCATION_ANNOTATION]
    )
    assert {g.power_w for g in record.grants} == {300}
    for i in range(3):
        assert bind(f"share-{i}", units=10, memory=1024, watts=300) == "powered"
    shares = [
        decode_allocation(
            cluster.read_pod("ml", f"share-{i}").manifest["metadata"]["annotations"][ALLOCATION_ANNOTATION]
        )
        for i in range(3)
    ]
    per_gpu: dict[int, int] = {}
    for s in shares:
        per_gpu[s.grants[0].index] = per_gpu.get(s.grants[0].index, 0) + s.grants[0].power_w
    assert max(per_gpu.values()) <= 700 and len(per_gpu) == 2  # two 300 W shares fit a 700 W GPU, not three
    unknown = service.filter(
        filter_args(pod_manifest("anywhere", gpus=1, annotations={GPU_POWER_ANNOTATION: "300"}), ["unknown"])
    )
    assert "does not publish its GPUs' power limits" in unknown["FailedAndUnresolvableNodes"]["unknown"]
    bad = service.filter(
        filter_args(pod_manifest("typo", gpus=1, annotations={GPU_POWER_ANNOTATION: "15w"}), nodes)
    )
    assert "linkpack.io/gpu-power-watts '15w'" in bad["FailedAndUnresolvableNodes"]["powered"]
