"""The scheduling surface end to end, with the real API server and kube-scheduler: policies as
objects (validated at admission), a namespace's default policy, the CUDA version a pod needs,
and GPU power budgets, each with its refusal reason in the pod's FailedScheduling event."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from contract.allocation import decode_allocation
from contract.gpu_topology import GpuPower, TopologyStatus, encode_status
from contract.keys import ALLOCATION_ANNOTATION, GROUP, TOPOLOGY_PLURAL, TOPOLOGY_VERSION
from contract.scheduling_policy import POLICY_PLURAL, POLICY_VERSION
from tests.cluster.controlplane import ControlPlane, temporary_namespace
from tests.cluster.linkpack_env import (
    ExtenderProcess,
    node_topology,
    published_nodes,
    running_extender,
    scheduler_config,
    wait_until,
)
from tests.support.pods import api_pod_manifest

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

SXM = "surface-h100"  # NVSwitch, driver 550 (CUDA 12.4), 200-700 W
PCIE = "surface-3090"  # PCIe, driver 535 (CUDA 12.2), 100-350 W
NODES = {
    SXM: ("hgx-h100", "550.54.15", "12.4", (700, 200, 700)),
    PCIE: ("rtx3090-2socket", "535.104.05", "12.2", (350, 100, 350)),
}
ROLE = {"linkpack-e2e": "surface"}
PCIE_MODEL = node_topology(PCIE, NODES[PCIE][0]).gpus[0].model


def _custom(cp: ControlPlane) -> Any:
    return client.CustomObjectsApi(cp.api_client())


def _publish_status(
    cp: ControlPlane, node: str, driver: str, cuda: str, power: tuple[int, int, int], gpus: int
) -> None:
    status = TopologyStatus(
        gpu_count=gpus,
        driver_version=driver,
        cuda_driver_version=cuda,
        gpu_power=tuple(GpuPower(i, *power) for i in range(gpus)),
        heartbeat="2026-12-01T00:00:00Z",
    )
    _custom(cp).patch_cluster_custom_object_status(
        GROUP, TOPOLOGY_VERSION, TOPOLOGY_PLURAL, node, {"status": encode_status(status)}
    )


@pytest.fixture(scope="module")
def surface(linkpack_crd: ControlPlane) -> Iterator[tuple[ControlPlane, ExtenderProcess]]:
    cp = linkpack_crd
    topologies = {node: node_topology(node, machine) for node, (machine, *_) in NODES.items()}
    with contextlib.ExitStack() as stack:
        stack.enter_context(published_nodes(cp, topologies))
        for node, (_, driver, cuda, power) in NODES.items():
            client.CoreV1Api(cp.api_client()).patch_node(node, {"metadata": {"labels": ROLE}})
            _publish_status(cp, node, driver, cuda, power, topologies[node].gpu_count)
        extender = stack.enter_context(running_extender(cp, "extender-surface"))
        cp.start_scheduler(scheduler_config(cp, extender.url, extender.tls))
        try:
            yield cp, extender
        finally:
            cp.stop_scheduler()


@pytest.fixture
def namespace(surface: tuple[ControlPlane, ExtenderProcess]) -> Iterator[str]:
    cp, _ = surface
    with temporary_namespace(cp.api_client(), prefix="surface-") as name:
        yield name


def _pod(name: str, annotations: dict[str, str] | None = None, **ask: int) -> dict[str, Any]:
    return api_pod_manifest(name, annotations=annotations, node_selector=ROLE, **ask)


def _submit(cp: ControlPlane, namespace: str, pod: dict[str, Any]) -> None:
    client.CoreV1Api(cp.api_client()).create_namespaced_pod(namespace, pod)


def _node_of(cp: ControlPlane, namespace: str, name: str) -> str | None:
    pod = client.CoreV1Api(cp.api_client()).read_namespaced_pod(name, namespace)
    return pod.spec.node_name


def _bound_to(cp: ControlPlane, namespace: str, name: str, timeout_s: float = 60) -> str:
    wait_until(lambda: _node_of(cp, namespace, name) is not None, timeout_s, f"{name} bound")
    node = _node_of(cp, namespace, name)
    assert node is not None
    return node


def _refusal(cp: ControlPlane, namespace: str, name: str, timeout_s: float = 60) -> str:
    """The pod's FailedScheduling message (the scheduler's, carrying the extender's reasons)."""
    core = client.CoreV1Api(cp.api_client())
    found: list[str] = []

    def failed() -> bool:
        events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
        found[:] = [e.message for e in events if e.reason == "FailedScheduling"]
        return bool(found)

    wait_until(failed, timeout_s, f"a FailedScheduling event for {name}")
    assert _node_of(cp, namespace, name) is None
    return found[-1]


def _policy(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{POLICY_VERSION}",
        "kind": "GpuSchedulingPolicy",
        "metadata": {"name": name},
        "spec": spec,
    }


def test_bad_policies_are_refused_at_admission(surface: tuple[ControlPlane, ExtenderProcess]) -> None:
    """The CRD's schema refuses negative weights, an unknown priority and a malformed CUDA version."""
    cp, _ = surface
    for spec in (
        {"weights": {"packing": -1}},
        {"computePriority": "urgent"},
        {"cudaVersion": "twelve"},
    ):
        with pytest.raises(ApiException) as refused:
            _custom(cp).create_cluster_custom_object(
                GROUP, POLICY_VERSION, POLICY_PLURAL, _policy("bad", **spec)
            )
        assert refused.value.status == 422, spec


def test_a_namespace_policy_decides_and_a_change_applies_to_the_next_pod(
    surface: tuple[ControlPlane, ExtenderProcess], namespace: str
) -> None:
    """A namespace labelled with a policy requiring NVSwitch gets its pods on the NVSwitch node;
    an unknown policy named by a pod keeps it pending with a reason naming it."""
    cp, _ = surface
    _custom(cp).create_cluster_custom_object(
        GROUP, POLICY_VERSION, POLICY_PLURAL, _policy("surface-fabric", topology={"requireNvswitch": True})
    )
    try:
        client.CoreV1Api(cp.api_client()).patch_namespace(
            namespace, {"metadata": {"labels": {"linkpack.io/policy": "surface-fabric"}}}
        )
        for i in range(3):
            _submit(cp, namespace, _pod(f"fabric-{i}", gpus=1))
        assert {_bound_to(cp, namespace, f"fabric-{i}") for i in range(3)} == {SXM}
        _submit(cp, namespace, _pod("lost", {"linkpack.io/policy": "no-such-policy"}, gpus=1))
        assert "unknown linkpack.io/policy 'no-such-policy'" in _refusal(cp, namespace, "lost")
    finally:
        _custom(cp).delete_cluster_custom_object(GROUP, POLICY_VERSION, POLICY_PLURAL, "surface-fabric")


def test_a_pod_needing_newer_cuda_than_a_driver_runs_goes_elsewhere_or_waits(
    surface: tuple[ControlPlane, ExtenderProcess], namespace: str
) -> None:
    """CUDA 12.4 can only run on the 550 driver; CUDA 12.8 runs nowhere and the event says why."""
    cp, _ = surface
    _submit(cp, namespace, _pod("cuda-124", {"linkpack.io/cuda-version": "12.4"}, gpus=1))
    assert _bound_to(cp, namespace, "cuda-124") == SXM
    _submit(cp, namespace, _pod("cuda-128", {"linkpack.io/cuda-version": "12.8"}, gpus=1))
    reason = _refusal(cp, namespace, "cuda-128")
    assert (
        "runs CUDA up to 12.2, the pod needs 12.8" in reason
        and "runs CUDA up to 12.4, the pod needs 12.8" in reason
    )


def test_power_budgets_are_kept_within_each_gpus_limits(
    surface: tuple[ControlPlane, ExtenderProcess], namespace: str
) -> None:
    """A 15 W whole-GPU budget fits no GPU's range (refused, naming the ranges); 650 W fits only the
    H100s; two 200 W shares of a 350 W GPU never land on the same GPU."""
    cp, _ = surface
    _submit(cp, namespace, _pod("tiny", {"linkpack.io/gpu-power-watts": "15"}, gpus=1))
    assert "15 W asked, the GPUs allow" in _refusal(cp, namespace, "tiny")
    _submit(cp, namespace, _pod("hot", {"linkpack.io/gpu-power-watts": "650"}, gpus=2))
    assert _bound_to(cp, namespace, "hot") == SXM
    pod = client.CoreV1Api(cp.api_client()).read_namespaced_pod("hot", namespace)
    assert {g.power_w for g in decode_allocation(pod.metadata.annotations[ALLOCATION_ANNOTATION]).grants} == {
        650
    }
    pcie_only = {"linkpack.io/gpu-power-watts": "200", "linkpack.io/policy": "surface-pcie"}
    _custom(cp).create_cluster_custom_object(
        GROUP,
        POLICY_VERSION,
        POLICY_PLURAL,
        _policy("surface-pcie", allowedGpuModels=[PCIE_MODEL]),
    )
    try:
        for i in range(2):
            _submit(cp, namespace, _pod(f"share-{i}", pcie_only, units=10, memory=1024))
        gpus = []
        for i in range(2):
            assert _bound_to(cp, namespace, f"share-{i}") == PCIE
            shared = client.CoreV1Api(cp.api_client()).read_namespaced_pod(f"share-{i}", namespace)
            gpus.append(decode_allocation(shared.metadata.annotations[ALLOCATION_ANNOTATION]).grants[0].index)
        assert gpus[0] != gpus[1]
    finally:
        _custom(cp).delete_cluster_custom_object(GROUP, POLICY_VERSION, POLICY_PLURAL, "surface-pcie")
