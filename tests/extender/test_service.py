"""Filter, prioritize and bind over an in-memory cluster: right answers, never double allocation."""

from __future__ import annotations

import threading

from contract.allocation import decode_allocation
from contract.keys import ALLOCATION_ANNOTATION, COMPUTE_PRIORITY_ANNOTATION, INTERPOSER_ANNOTATION
from extender.binding.reconciler import reconcile_once
from extender.config import ExtenderConfig
from extender.kube.in_memory import InMemoryCluster
from extender.service import ExtenderService, handlers_for
from extender.state.cluster_api import ApiError
from tests.support.machines import hgx_h100
from tests.support.pods import filter_args, pod_manifest
from topology.accounting import accumulate

NODES = ["nv-node", "pcie-node", "bare-node"]


def _bind(service: ExtenderService, cluster: InMemoryCluster, pod: dict, node: str) -> str:
    created = cluster.create_pod(pod)
    meta = created["metadata"]
    return service.bind(
        {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": node}
    )["Error"]


def test_a_node_without_topology_record_is_unresolvable(service: ExtenderService) -> None:
    result = service.filter(filter_args(pod_manifest(gpus=2), NODES))
    assert result["NodeNames"] == ["nv-node", "pcie-node"]
    assert result["FailedAndUnresolvableNodes"] == {"bare-node": "node has no GPU topology record"}
    assert result["Error"] == ""


def test_asking_more_gpus_than_a_node_has_is_unresolvable(service: ExtenderService) -> None:
    result = service.filter(filter_args(pod_manifest(gpus=9), ["nv-node"]))
    assert result["NodeNames"] == []
    assert "nv-node" in result["FailedAndUnresolvableNodes"]


def test_an_unknown_policy_fails_every_node_with_the_reason(service: ExtenderService) -> None:
    pod = pod_manifest(gpus=1, policy="yolo")
    result = service.filter(filter_args(pod, NODES))
    assert set(result["FailedAndUnresolvableNodes"]) == set(NODES)
    assert "unknown linkpack.io/policy 'yolo'" in result["FailedAndUnresolvableNodes"]["nv-node"]


def test_a_four_gpu_pod_prefers_the_nvswitch_node(service: ExtenderService) -> None:
    scores = {
        p["Host"]: p["Score"]
        for p in service.prioritize(filter_args(pod_manifest(gpus=4), ["nv-node", "pcie-node"]))
    }
    assert scores["nv-node"] > scores["pcie-node"]


def test_bind_records_the_allocation_on_the_pod_and_in_the_ledger(
    service: ExtenderService, cluster: InMemoryCluster
) -> None:
    assert _bind(service, cluster, pod_manifest("trainer", gpus=2), "pcie-node") == ""
    pod = cluster.read_pod("ml", "trainer")
    assert pod.tracked.node_name == "pcie-node"
    allocation = decode_allocation(pod.manifest["metadata"]["annotations"][ALLOCATION_ANNOTATION])
    assert allocation.node == "pcie-node" and len(allocation.grants) == 2
    # the two GPUs share a socket: NODE beats SYS
    a, b = allocation.gpu_indices
    assert a // 4 == b // 4
    assert cluster.read_ledger("pcie-node").by_uid()[pod.tracked.uid].allocation == allocation


def test_the_node_fills_up_and_then_filter_says_why(
    service: ExtenderService, cluster: InMemoryCluster
) -> None:
    for i in range(4):
        assert _bind(service, cluster, pod_manifest(f"p{i}", gpus=2), "nv-node") == ""
    result = service.filter(filter_args(pod_manifest(gpus=1), ["nv-node"]))
    assert result["FailedNodes"]["nv-node"].startswith("too few free GPUs")


def test_a_failed_binding_rolls_the_allocation_back(
    service: ExtenderService, cluster: InMemoryCluster
) -> None:
    cluster.fail_next_bind = "apiserver unavailable"
    error = _bind(service, cluster, pod_manifest("unlucky", gpus=8), "nv-node")
    assert "apiserver unavailable" in error
    assert cluster.read_ledger("nv-node").entries == ()
    assert _bind(service, cluster, pod_manifest("lucky", gpus=8), "nv-node") == ""


def test_binding_a_recreated_pod_is_refused(service: ExtenderService, cluster: InMemoryCluster) -> None:
    cluster.create_pod(pod_manifest("same-name", gpus=1))
    error = service.bind(
        {"PodName": "same-name", "PodNamespace": "ml", "PodUID": "old-uid", "Node": "nv-node"}
    )["Error"]
    assert "was re-created" in error
    assert cluster.read_ledger("nv-node").entries == ()


def test_shares_pack_onto_one_gpu_before_opening_another(
    service: ExtenderService, cluster: InMemoryCluster
) -> None:
    for i in range(4):
        assert _bind(service, cluster, pod_manifest(f"s{i}", units=25, memory=8192), "nv-node") == ""
    gpus = {
        decode_allocation(p["metadata"]["annotations"][ALLOCATION_ANNOTATION]).gpu_indices
        for p in cluster.pods()
    }
    assert len(gpus) == 1


def test_concurrent_binders_never_overallocate(config: ExtenderConfig, cluster: InMemoryCluster) -> None:
    """Two extender instances (as after a failover, or two schedulers) bind 12 pods of 2 GPUs at once."""
    services = [ExtenderService(config, cluster) for _ in range(2)]
    for svc in services:
        cluster.run_watches(handlers_for(svc), lambda: True)
    pods = [cluster.create_pod(pod_manifest(f"race-{i}", gpus=2)) for i in range(12)]
    errors: list[str] = []

    def work(svc: ExtenderService, batch: list[dict]) -> None:
        for p in batch:
            m = p["metadata"]
            errors.append(
                svc.bind({"PodName": m["name"], "PodNamespace": "ml", "PodUID": m["uid"], "Node": "nv-node"})[
                    "Error"
                ]
            )

    threads = [threading.Thread(target=work, args=(services[i % 2], pods[i::2])) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(1 for e in errors if e == "") == 4
    grants = [
        g
        for p in cluster.pods()
        if ALLOCATION_ANNOTATION in p["metadata"].get("annotations", {})
        for g in decode_allocation(p["metadata"]["annotations"][ALLOCATION_ANNOTATION]).grants
    ]
    _, problems = accumulate(hgx_h100(), grants, config.units_per_gpu)
    assert problems == ()


def test_a_restarted_extender_rebuilds_everything_from_the_api(
    config: ExtenderConfig, service: ExtenderService, cluster: InMemoryCluster
) -> None:
    assert _bind(service, cluster, pod_manifest("kept", gpus=6), "nv-node") == ""
    fresh = ExtenderService(config, cluster)
    cluster.run_watches(handlers_for(fresh), lambda: True)
    result = fresh.filter(filter_args(pod_manifest(gpus=4), ["nv-node"]))
    assert result["FailedNodes"]["nv-node"].startswith("too few free GPUs")
    assert fresh.filter(filter_args(pod_manifest(gpus=2), ["nv-node"]))["NodeNames"] == ["nv-node"]


def test_deleting_a_pod_frees_its_gpus(service: ExtenderService, cluster: InMemoryCluster) -> None:
    assert _bind(service, cluster, pod_manifest("gone", gpus=8), "nv-node") == ""
    cluster.delete_pod("ml", "gone")
    assert reconcile_once(service) == 1
    assert service.filter(filter_args(pod_manifest(gpus=8), ["nv-node"]))["NodeNames"] == ["nv-node"]


def test_a_reservation_that_never_binds_expires(service: ExtenderService, cluster: InMemoryCluster) -> None:
    """A commit left behind by a crash between ledger write and Binding is released after the timeout."""
    from contract.allocation import Allocation
    from contract.ledger import LedgerEntry
    from topology.scheduling import GpuGrant

    created = cluster.create_pod(pod_manifest("orphan", gpus=1))
    uid = created["metadata"]["uid"]
    grant = GpuGrant(0, "GPU-hgx-h100-0", True)
    ledger = cluster.read_ledger("nv-node")
    cluster.write_ledger(
        ledger.with_entry(LedgerEntry(uid, "ml", "orphan", Allocation("nv-node", (grant,)), 1000.0))
    )
    assert reconcile_once(service, now=1000.0 + 10) == 0
    assert reconcile_once(service, now=1000.0 + service.config.reservation_timeout_s + 1) == 1
    assert cluster.read_ledger("nv-node").entries == ()


def test_bind_after_filter_does_not_read_the_pod_again(
    service: ExtenderService, cluster: InMemoryCluster
) -> None:
    """The request parsed at filter time is reused: one API read fewer on the bind path."""
    created = cluster.create_pod(pod_manifest("fast", gpus=2))
    service.filter(filter_args(created, ["nv-node"]))
    reads = []
    original = cluster.read_pod
    cluster.read_pod = lambda ns, name: reads.append(name) or original(ns, name)  # type: ignore[method-assign]
    m = created["metadata"]
    assert service.bind({"PodName": "fast", "PodNamespace": "ml", "PodUID": m["uid"], "Node": "nv-node"}) == {
        "Error": ""
    }
    assert reads == []
    assert cluster.read_pod("ml", "fast").tracked.node_name == "nv-node"


def test_a_lost_binding_reply_keeps_the_commit(service: ExtenderService, cluster: InMemoryCluster) -> None:
    """If the Binding succeeded but its answer was lost, the ledger entry must stay (no double allocation)."""
    created = cluster.create_pod(pod_manifest("lost-reply", gpus=8))
    original = cluster.bind

    def bind_then_fail(*args, **kwargs):  # the API server binds, then the connection drops
        original(*args, **kwargs)
        raise ApiError("connection reset by peer")

    cluster.bind = bind_then_fail  # type: ignore[method-assign]
    m = created["metadata"]
    assert service.bind(
        {"PodName": "lost-reply", "PodNamespace": "ml", "PodUID": m["uid"], "Node": "nv-node"}
    ) == {"Error": ""}
    assert len(cluster.read_ledger("nv-node").entries) == 1


def test_an_upper_case_cordon_keeps_the_gpu_out_of_placements(config: ExtenderConfig) -> None:
    """GPU UUIDs in the cordon annotation compare case-insensitively: an upper-case paste of seven
    of eight lower-case UUIDs leaves exactly one GPU to place on."""
    from dataclasses import replace

    from contract.gpu_topology import as_published
    from contract.keys import CORDON_ANNOTATION
    from extender.kube.translate import node_facts

    base = hgx_h100()
    gpus = tuple(replace(g, uuid=f"GPU-da87d0c6-1a2b-3c4d-5e6f-{g.index:012x}") for g in base.gpus)
    topology = replace(base, gpus=gpus)
    cordoned = ",".join(g.uuid.upper() for g in gpus[:7])
    cluster = InMemoryCluster(config)
    facts = node_facts({"metadata": {"name": "dgx", "annotations": {CORDON_ANNOTATION: cordoned}}})
    cluster.add_node(facts, as_published("dgx", topology))
    service = ExtenderService(config, cluster)
    cluster.run_watches(handlers_for(service), lambda: True)
    assert service.filter(filter_args(pod_manifest(gpus=2), ["dgx"]))["NodeNames"] == []
    pod = pod_manifest("one", gpus=1)
    assert service.filter(filter_args(pod, ["dgx"]))["NodeNames"] == ["dgx"]
    assert _bind(service, cluster, pod, "dgx") == ""
    allocation = decode_allocation(
        cluster.read_pod("ml", "one").manifest["metadata"]["annotations"][ALLOCATION_ANNOTATION]
    )
    assert allocation.gpu_indices == (7,)


def test_the_enforcement_level_follows_what_the_node_publishes(config: ExtenderConfig) -> None:
    """A share on a node whose GpuTopology status says MPS is active is recorded as MPS-enforced;
    the same share elsewhere is cooperative; whole GPUs need no enforcement."""
    from contract.allocation import Enforcement
    from contract.gpu_topology import as_published
    from extender.state.snapshot import NodeFacts

    cluster = InMemoryCluster(config)
    cluster.add_node(NodeFacts("mps"), as_published("mps", hgx_h100("m"), mps_active=True))
    cluster.add_node(NodeFacts("plain"), as_published("plain", hgx_h100("p")))
    service = ExtenderService(config, cluster)
    cluster.run_watches(handlers_for(service), lambda: True)

    def level(name: str, node: str, **ask: int) -> Enforcement:
        assert _bind(service, cluster, pod_manifest(name, **ask), node) == ""
        annotations = cluster.read_pod("ml", name).manifest["metadata"]["annotations"]
        return decode_allocation(annotations[ALLOCATION_ANNOTATION]).enforcement

    assert level("share-mps", "mps", units=20, memory=1024) is Enforcement.HARD_MPS
    assert level("share-plain", "plain", units=20, memory=1024) is Enforcement.COOPERATIVE
    assert level("whole", "mps", gpus=1) is Enforcement.NONE


def test_shares_get_the_interposer_where_the_node_ships_it_unless_they_opt_out(
    config: ExtenderConfig,
) -> None:
    """A node that publishes interposer.available gets share pods recorded as interposer-enforced;
    a pod annotated linkpack.io/interposer: off is recorded as cooperative, truthfully weaker."""
    from contract.allocation import Enforcement
    from contract.gpu_topology import as_published
    from extender.state.snapshot import NodeFacts

    cluster = InMemoryCluster(config)
    cluster.add_node(NodeFacts("held"), as_published("held", hgx_h100("h"), interposer_available=True))
    service = ExtenderService(config, cluster)
    cluster.run_watches(handlers_for(service), lambda: True)

    def level(pod: dict) -> Enforcement:
        assert _bind(service, cluster, pod, "held") == ""
        annotations = cluster.read_pod("ml", pod["metadata"]["name"]).manifest["metadata"]["annotations"]
        return decode_allocation(annotations[ALLOCATION_ANNOTATION]).enforcement

    assert level(pod_manifest("held-share", units=30, memory=2048)) is Enforcement.INTERPOSER
    opted_out = pod_manifest("free-share", units=30, memory=2048, annotations={INTERPOSER_ANNOTATION: "off"})
    assert level(opted_out) is Enforcement.COOPERATIVE


def test_compute_priority_comes_from_the_annotation_or_the_priority_class(
    service: ExtenderService, cluster: InMemoryCluster
) -> None:
    """The allocation records the share's compute priority: the annotation wins, else a high
    PriorityClass value makes it high; a bad annotation is refused with its value."""
    from contract.allocation import ComputePriority

    def priority(pod: dict) -> ComputePriority:
        assert _bind(service, cluster, pod, "nv-node") == ""
        annotations = cluster.read_pod("ml", pod["metadata"]["name"]).manifest["metadata"]["annotations"]
        return decode_allocation(annotations[ALLOCATION_ANNOTATION]).priority

    low = pod_manifest("batch", units=10, memory=1024, annotations={COMPUTE_PRIORITY_ANNOTATION: "low"})
    assert priority(low) is ComputePriority.LOW
    serving = pod_manifest("serving", units=10, memory=1024)
    serving["spec"]["priority"] = 100000
    assert priority(serving) is ComputePriority.HIGH
    assert priority(pod_manifest("plain", units=10, memory=1024)) is ComputePriority.NORMAL
    bad = pod_manifest("bad", units=10, memory=1024, annotations={COMPUTE_PRIORITY_ANNOTATION: "urgent"})
    result = service.filter(filter_args(bad, ["nv-node"]))
    assert "linkpack.io/compute-priority 'urgent'" in result["FailedAndUnresolvableNodes"]["nv-node"]


def test_a_repeated_prioritize_reuses_its_answer_until_a_node_changes(
    config: ExtenderConfig, service: ExtenderService, cluster: InMemoryCluster
) -> None:
    """With nothing changed the same answer comes back; after a bind changes a node the answer
    is rebuilt, and it is what an extender started afresh on the same cluster answers."""
    body = filter_args(pod_manifest(gpus=4), ["nv-node", "pcie-node"])
    first = service.prioritize(body)
    assert service.prioritize(body) is first
    pod = cluster.create_pod(pod_manifest("taker", gpus=4))
    service.filter(filter_args(pod, ["nv-node"]))
    bound = service.bind(
        {"PodName": "taker", "PodNamespace": "ml", "PodUID": pod["metadata"]["uid"], "Node": "nv-node"}
    )
    assert bound == {"Error": ""}
    after = service.prioritize(body)
    assert after is not first
    fresh = ExtenderService(config, cluster)
    cluster.run_watches(handlers_for(fresh), lambda: True)
    assert after == fresh.prioritize(body)
