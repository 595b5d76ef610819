"""The extender deciding the node itself (decideNode), and what it knows to do so: node CPU and
memory from its node and pod watches, and the workload learned from the pods it sees."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from contract.compute_demand import ComputeDemand
from contract.gpu_topology import as_published
from extender.config import ExtenderConfig
from extender.kube.in_memory import InMemoryCluster
from extender.kube.translate import node_facts, tracked_pod
from extender.placing import reference
from extender.service import ExtenderService, handlers_for
from extender.serving.app import create_app
from extender.state.pod_requests import PodRequest, read_pod_request
from extender.state.snapshot import NodeFacts, TrackedPod
from extender.state.store import ClusterStore
from tests.support.machines import hgx_h100, rtx3090_two_socket
from tests.support.nodes import node_object
from tests.support.pods import container, filter_args, pod_manifest
from topology.fragmentation import PodShape
from topology.node_choice import choose_node
from topology.scoring import default_fragmentation

pytestmark = pytest.mark.timeout(60)

NODES = ["nv-node", "pcie-node"]


@pytest.fixture
def deciding() -> tuple[ExtenderService, InMemoryCluster]:
    config = ExtenderConfig()  # built-in policies decide the node
    cluster = InMemoryCluster(config)
    allocatable = ComputeDemand(64_000, 512 * 1024)
    cluster.add_node(NodeFacts("nv-node", allocatable=allocatable), as_published("nv-node", hgx_h100()))
    cluster.add_node(
        NodeFacts("pcie-node", allocatable=allocatable), as_published("pcie-node", rtx3090_two_socket())
    )
    service = ExtenderService(config, cluster)
    cluster.run_watches(handlers_for(service), lambda: True)
    return service, cluster


def _with_cpu(pod: dict[str, Any], cpu: str, memory: str = "1Gi") -> dict[str, Any]:
    pod["spec"]["containers"][0]["resources"]["requests"].update({"cpu": cpu, "memory": memory})
    return pod


def test_filter_answers_the_one_node_the_ranking_chooses(
    deciding: tuple[ExtenderService, InMemoryCluster],
) -> None:
    """Under a deciding policy filter passes exactly the node `choose_node` ranks first and
    leaves the other fitting node out of the answer (the scheduler drops it); the explain log
    says it was not chosen, naming the chosen one."""
    service, _ = deciding
    pod = _with_cpu(pod_manifest(gpus=1), "4")
    result = service.filter(filter_args(pod, NODES))
    assert len(result["NodeNames"]) == 1
    assert result["FailedNodes"] == {} and result["FailedAndUnresolvableNodes"] == {}
    chosen = result["NodeNames"][0]
    other = next(n for n in NODES if n != chosen)
    log = service.decisions_for("ml", pod["metadata"]["name"])
    assert log is not None and log.filtered is not None
    assert f"linkpack chose node {chosen}" in log.filtered.failed[other]
    snapshot = service.store.snapshot()
    parsed = read_pod_request(pod, service.config, snapshot.book)
    assert isinstance(parsed, PodRequest) and parsed.decide_node
    fragmentation = default_fragmentation()
    terms = [
        reference.scoring_terms(
            snapshot, n, parsed, reference.node_outcome(snapshot, n, parsed), fragmentation
        )
        for n in NODES
    ]
    best = choose_node([t for t in terms if t is not None])
    assert best is not None and best.node == chosen


def test_a_policy_with_decide_node_false_leaves_the_choice_to_the_scores(
    deciding: tuple[ExtenderService, InMemoryCluster],
) -> None:
    """A GpuSchedulingPolicy with decideNode: false gets every fitting node back, as before."""
    service, cluster = deciding
    cluster.put_policy(
        {
            "apiVersion": "linkpack.io/v1alpha1",
            "kind": "GpuSchedulingPolicy",
            "metadata": {"name": "mix"},
            "spec": {"decideNode": False},
        }
    )
    result = service.filter(filter_args(pod_manifest(gpus=1, policy="mix"), NODES))
    assert result["NodeNames"] == NODES


def _node(name: str, cpu: str = "64", memory: str = "256Gi") -> dict[str, Any]:
    return node_object(name, allocatable={"cpu": cpu, "memory": memory})


def _pod(uid: str, node: str = "", cpu: str = "1", phase: str = "Running", gpus: int = 0) -> TrackedPod:
    """A pod whose init container asks for 8 CPUs and 1Gi, its app container `cpu` and 2Gi (and
    `gpus`), with 250m of RuntimeClass overhead."""
    fetch = container("fetch", requests={"cpu": "8", "memory": "1Gi"}, image=None)
    return tracked_pod(
        pod_manifest(
            uid,
            uid=uid,
            node=node,
            phase=phase,
            scheduler=None,
            gpus=gpus,
            requests={"cpu": cpu, "memory": "2Gi"},
            image=None,
            init_containers=[fetch],
            overhead={"cpu": "250m"},
        )
    )


def test_node_cpu_and_memory_free_count_every_pod_bound_there_and_not_finished() -> None:
    """Allocatable minus the effective requests (init max, overhead) of the node's pods, GPU or not;
    a finished or deleted pod gives its share back; a pending pod takes nothing."""
    store = ClusterStore(100)
    store.apply_node(node_facts(_node("n1")))
    store.apply_pod(_pod("a", "n1", cpu="2"))  # init 8 > app 2: 8 + 0.25 overhead
    store.apply_pod(_pod("b", "n1", cpu="10", gpus=1))  # 10.25
    store.apply_pod(_pod("c", "", cpu="30"))  # pending
    entry = store.snapshot().node("n1")
    assert entry is not None and entry.free_compute == ComputeDemand(64_000 - 8250 - 10250, 256 * 1024 - 4096)
    store.apply_pod(_pod("b", "n1", cpu="10", phase="Succeeded", gpus=1))
    store.remove_pod("a")
    entry = store.snapshot().node("n1")
    assert entry is not None and entry.free_compute == ComputeDemand(64_000, 256 * 1024)


def test_the_learned_workload_follows_the_gpu_pods_seen_deterministically() -> None:
    """GPU pods are counted once each (CPU-only pods not at all); the same events give the same
    workload, and the shapes seen most lead it."""

    def feed() -> ClusterStore:
        store = ClusterStore(100)
        for i in range(300):
            store.apply_pod(_pod(f"g{i}", cpu="12", gpus=1))
            store.apply_pod(_pod(f"g{i}", "n1", cpu="12", gpus=1))  # the same pod, bound: not counted again
            store.apply_pod(_pod(f"c{i}", "n1", cpu="3"))
        return store

    first, second = feed().snapshot(), feed().snapshot()
    assert first.workload == second.workload and first.workload_version == second.workload_version > 0
    top = first.workload[0]
    assert (top.cpu_milli, top.gpu_milli, top.gpu_count) == (12_250, 1000, 1)
    assert top.probability > 0.8
    assert tracked_pod({"metadata": {"uid": "x"}, "spec": {}}).gpu_shape is None
    assert _pod("s", cpu="1", gpus=2).gpu_shape == PodShape(8250, 1000, 2)


def test_gpu_pods_asking_for_no_cpu_fill_one_node_after_another() -> None:
    """Ten identical 8-GPU nodes with 64 CPUs each and forty 1-GPU pods asking for no CPU, every
    pod seeing all ten nodes (as the scheduler asks): the decided nodes fill one after another,
    five nodes full and five left empty for whole-node jobs, not a few pods on every node."""
    config = ExtenderConfig()
    cluster = InMemoryCluster(config)
    names = [f"h100-{i}" for i in range(10)]
    for name in names:
        facts = NodeFacts(name, allocatable=ComputeDemand(64_000, 512 * 1024))
        cluster.add_node(facts, as_published(name, hgx_h100(name)))
    service = ExtenderService(config, cluster)
    cluster.run_watches(handlers_for(service), lambda: True)
    used: dict[str, int] = {}
    for i in range(40):
        created = cluster.create_pod(pod_manifest(f"one-{i}", gpus=1))
        (node,) = service.filter(filter_args(created, names))["NodeNames"]
        m = created["metadata"]
        bound = service.bind(
            {"PodName": m["name"], "PodNamespace": m["namespace"], "PodUID": m["uid"], "Node": node}
        )
        assert bound["Error"] == ""
        used[node] = used.get(node, 0) + 1
    assert sorted(used.values()) == [8] * 5


def test_explain_of_a_decided_pod_names_the_runner_up_its_scores_and_why_it_lost(
    deciding: tuple[ExtenderService, InMemoryCluster],
) -> None:
    """The scheduler never prioritizes a pod whose filter answer names one node, so explain
    scores the chosen node and the runner-up it was weighed against, and says which step of
    the ranking told them apart."""
    service, cluster = deciding
    pod = cluster.create_pod(_with_cpu(pod_manifest("weighed", gpus=1), "4"))
    (chosen,) = service.filter(filter_args(pod, NODES))["NodeNames"]
    with TestClient(create_app(service)) as http:
        doc = http.get("/debug/explain/ml/weighed").json()
    (runner_up,) = [n for n in NODES if n != chosen]
    assert doc["decision"]["chosen"] == chosen and doc["decision"]["runnerUp"] == runner_up
    assert doc["decision"]["decidedBy"] in (
        "fragmentation", "CPU/GPU balance", "CPU shortfall", "ring bottleneck", "name order",
    )  # fmt: skip
    assert doc["summary"].endswith(f"chosen over {runner_up} by {doc['decision']['decidedBy']}")
    rows = {r["node"]: r for r in doc["nodes"]}
    assert rows[chosen]["score"] is not None and rows[runner_up]["score"] is not None
    assert rows[runner_up]["filter"] == "failed" and chosen in rows[runner_up]["reason"]
