"""The extender behind the real kube-scheduler, on a real API server, with fake GPU nodes.

One installation is shared by the module: four GPU nodes from captured machines (8x H100
NVSwitch, DGX-1 V100 hybrid cube mesh, PCIe pairs with NVLink bridges, a two-socket PCIe box),
their GpuTopology records, the extender as its own process and kube-scheduler running the
KubeSchedulerConfiguration shipped in manifests/ (only kubeconfig and URL substituted).
Every check of what was allocated reads the allocation annotations back from the API.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from kubernetes import client

from contract.allocation import decode_allocation
from contract.keys import ALLOCATION_ANNOTATION
from tests.cluster.controlplane import ControlPlane, temporary_namespace
from tests.cluster.linkpack_env import (
    GPU_NODES,
    HOSTNAME,
    ExtenderProcess,
    node_topology,
    published_nodes,
    running_extender,
    scheduler_config,
    wait_until,
)
from tests.support.pods import api_pod_manifest
from topology.accounting import accumulate
from topology.oracle import oracle_best_set
from topology.placement import set_quality
from topology.scheduling import NodeState, WholeGpus

pytestmark = pytest.mark.cluster
TOPOLOGIES = {node: node_topology(node, machine) for node, machine in GPU_NODES}


@pytest.fixture(scope="module")
def installation(linkpack_crd: ControlPlane) -> Iterator[tuple[ControlPlane, ExtenderProcess]]:
    cp = linkpack_crd
    with published_nodes(cp, TOPOLOGIES), running_extender(cp) as extender:
        cp.start_scheduler(scheduler_config(cp, extender.url, extender.tls))
        try:
            yield cp, extender
        finally:
            cp.stop_scheduler()


@pytest.fixture
def namespace(installation: tuple[ControlPlane, ExtenderProcess]) -> Iterator[str]:
    cp, _ = installation
    with temporary_namespace(cp.api_client(), prefix="e2e-") as name:
        yield name
    _wait_ledgers_empty_of(cp, name)


def _core(cp: ControlPlane) -> Any:
    return client.CoreV1Api(cp.api_client())


def _pods(cp: ControlPlane, namespace: str) -> list[Any]:
    return list(_core(cp).list_namespaced_pod(namespace).items)


def _create(cp: ControlPlane, namespace: str, pod: dict[str, Any]) -> None:
    _core(cp).create_namespaced_pod(namespace, pod)


def _bound(cp: ControlPlane, namespace: str) -> dict[str, Any]:
    return {p.metadata.name: p for p in _pods(cp, namespace) if p.spec.node_name}


def _allocation(pod: Any) -> Any:
    return decode_allocation(pod.metadata.annotations[ALLOCATION_ANNOTATION])


def _assert_no_overcommit(cp: ControlPlane) -> None:
    """Sum every allocation annotation in the cluster per GPU: never above capacity."""
    grants: dict[str, list[Any]] = {}
    for pod in _core(cp).list_pod_for_all_namespaces().items:
        annotations = pod.metadata.annotations or {}
        if ALLOCATION_ANNOTATION in annotations and pod.spec.node_name:
            allocation = decode_allocation(annotations[ALLOCATION_ANNOTATION])
            assert allocation.node == pod.spec.node_name
            grants.setdefault(allocation.node, []).extend(allocation.grants)
    for node, node_grants in grants.items():
        _, problems = accumulate(TOPOLOGIES[node], node_grants, 100)
        assert problems == (), f"{node}: {problems}"


def _wait_ledgers_empty_of(cp: ControlPlane, namespace: str) -> None:
    def clean() -> bool:
        maps = _core(cp).list_namespaced_config_map(
            "linkpack-system", label_selector="linkpack.io/ledger=true"
        )
        return all(f'"namespace":"{namespace}"' not in (m.data or {}).get("ledger", "") for m in maps.items)

    wait_until(clean, 60, f"ledgers to release the pods of {namespace}")


@pytest.mark.parametrize("node", [n for n, _ in GPU_NODES])
@pytest.mark.parametrize("count", [1, 2, 4, 8])
def test_whole_gpu_pods_get_the_best_connected_set(
    installation: tuple[ControlPlane, ExtenderProcess], namespace: str, node: str, count: int
) -> None:
    """On an empty node, a k-GPU pod gets a set as good as the exhaustive oracle's."""
    cp, _ = installation
    _create(cp, namespace, api_pod_manifest("job", gpus=count, node_selector={HOSTNAME: node}))
    wait_until(lambda: "job" in _bound(cp, namespace), 60, f"{count}-GPU pod bound on {node}")
    pod = _bound(cp, namespace)["job"]
    chosen = _allocation(pod).gpu_indices
    topology = TOPOLOGIES[node]
    best = oracle_best_set(NodeState.empty(node, topology), WholeGpus(count))
    assert best is not None
    assert set_quality(topology, chosen).bottleneck_gbps == set_quality(topology, best.gpus).bottleneck_gbps
    assert set_quality(topology, chosen).total_pair_gbps == set_quality(topology, best.gpus).total_pair_gbps


def test_fractional_pods_pack_onto_one_gpu(
    installation: tuple[ControlPlane, ExtenderProcess], namespace: str
) -> None:
    """Four quarter-GPU pods share a GPU instead of taking four."""
    cp, _ = installation
    for i in range(4):
        _create(
            cp,
            namespace,
            api_pod_manifest(f"infer-{i}", units=25, memory=8192, node_selector={HOSTNAME: "e2e-h100"}),
        )
        wait_until(lambda i=i: f"infer-{i}" in _bound(cp, namespace), 60, f"share pod {i} bound")
    allocations = [_allocation(p) for p in _bound(cp, namespace).values()]
    assert len({a.gpu_indices for a in allocations}) == 1
    assert sum(a.grants[0].units for a in allocations) == 100
    assert all(a.enforcement.value == "cooperative" for a in allocations)


def test_a_pod_that_fits_nowhere_says_why(
    installation: tuple[ControlPlane, ExtenderProcess], namespace: str
) -> None:
    """The FailedScheduling event names the extender's reason."""
    cp, _ = installation
    _create(cp, namespace, api_pod_manifest("huge-share", units=50, memory=900_000))

    def reason() -> str:
        events = (
            _core(cp).list_namespaced_event(namespace, field_selector="involvedObject.name=huge-share").items
        )
        return " ".join(e.message or "" for e in events if e.reason == "FailedScheduling")

    wait_until(lambda: "no GPU on the node has that much memory" in reason(), 60, "a FailedScheduling event")
    assert "0/" in reason()


def test_an_unknown_policy_is_reported_on_the_pod(
    installation: tuple[ControlPlane, ExtenderProcess], namespace: str
) -> None:
    cp, _ = installation
    _create(cp, namespace, api_pod_manifest("odd-policy", gpus=1, policy="fastest"))

    def reason() -> str:
        events = (
            _core(cp).list_namespaced_event(namespace, field_selector="involvedObject.name=odd-policy").items
        )
        return " ".join(e.message or "" for e in events if e.reason == "FailedScheduling")

    wait_until(lambda: "unknown linkpack.io/policy 'fastest'" in reason(), 60, "the policy reason")


def test_restarting_the_extender_mid_stream_loses_and_duplicates_nothing(
    installation: tuple[ControlPlane, ExtenderProcess], namespace: str
) -> None:
    """The extender is killed while pods are being bound and started again on the same port."""
    cp, extender = installation
    for i in range(12):
        _create(cp, namespace, api_pod_manifest(f"s-{i}", gpus=1 + i % 2))
    wait_until(lambda: len(_bound(cp, namespace)) >= 3, 60, "the first binds")
    extender.kill()
    for i in range(12, 20):
        _create(cp, namespace, api_pod_manifest(f"s-{i}", gpus=1 + i % 2))
    extender.start()
    wait_until(lambda: len(_bound(cp, namespace)) == 20, 120, "all 20 pods bound after the restart")
    bound = _bound(cp, namespace)
    per_node: dict[str, list[int]] = {}
    for pod in bound.values():
        allocation = _allocation(pod)
        per_node.setdefault(allocation.node, []).extend(allocation.gpu_indices)
    for node, gpus in per_node.items():
        assert len(gpus) == len(set(gpus)), f"{node} has a GPU twice: {sorted(gpus)}"
    _assert_no_overcommit(cp)


def test_a_burst_of_200_mixed_pods_never_overcommits(
    installation: tuple[ControlPlane, ExtenderProcess], namespace: str
) -> None:
    cp, _ = installation
    shapes = [
        {"gpus": 1},
        {"gpus": 2},
        {"gpus": 4},
        {"units": 25, "memory": 8192},
        {"units": 50, "memory": 16384},
    ]
    for i in range(200):
        _create(cp, namespace, api_pod_manifest(f"b-{i:03d}", **shapes[i % len(shapes)]))
    last = [-1, 0]

    def settled() -> bool:
        n = len(_bound(cp, namespace))
        last[1] = last[1] + 1 if n == last[0] else 0
        last[0] = n
        return last[1] >= 12

    wait_until(settled, 240, "the burst to settle", interval_s=0.5)
    used = {
        (a.node, g.index) for p in _bound(cp, namespace).values() for a in [_allocation(p)] for g in a.grants
    }
    assert len(used) >= 28, f"only {len(used)} of 32 GPUs carry an allocation after the burst"
    _assert_no_overcommit(cp)


def test_two_extenders_binding_at_once_never_overallocate(
    installation: tuple[ControlPlane, ExtenderProcess], namespace: str
) -> None:
    """A second extender (as during a failover or with a second scheduler) races the first."""
    cp, first = installation
    core = _core(cp)
    names = [f"race-{i}" for i in range(10)]
    for name in names:
        pod = api_pod_manifest(
            name, gpus=2, node_selector={HOSTNAME: "no-such-node"}
        )  # the scheduler finds no node: only our binders act
        _create(cp, namespace, pod)
    uids = {p.metadata.name: p.metadata.uid for p in _pods(cp, namespace)}
    results: list[str] = []
    with running_extender(cp, "extender-b") as second:
        wait_until(lambda: all(_ready(e) for e in (first, second)), 30, "both extenders ready")

        def bind(extender: ExtenderProcess, batch: list[str]) -> None:
            url = extender.url
            with extender.scheduler_client() as http:
                for name in batch:
                    body = {
                        "PodName": name,
                        "PodNamespace": namespace,
                        "PodUID": uids[name],
                        "Node": "e2e-h100",
                    }
                    results.append(http.post(f"{url}/bind", json=body).json()["Error"])

        threads = [
            threading.Thread(target=bind, args=(first, names[0::2])),
            threading.Thread(target=bind, args=(second, names[1::2])),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sum(1 for r in results if r == "") == 4, results
    on_node = [p for p in core.list_namespaced_pod(namespace).items if p.spec.node_name == "e2e-h100"]
    assert len(on_node) == 4
    _assert_no_overcommit(cp)


def _ready(extender: ExtenderProcess) -> bool:
    try:
        return httpx.get(f"{extender.ops_url}/readyz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False
