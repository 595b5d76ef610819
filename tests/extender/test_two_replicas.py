"""Two extender replicas (active-active) on one cluster: what each writes is safe with the other.

Each replica is an `ExtenderService` with its own watch-fed store on the same in-memory cluster
(real resourceVersion preconditions on ledgers and Bindings). A lagging replica is one whose
pod watch has not delivered the newest pods yet, as a separate watch connection can lag.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from contract.allocation import Allocation
from contract.ledger import LedgerEntry
from extender.binding.reconciler import reconcile_once
from extender.config import ExtenderConfig
from extender.kube.in_memory import InMemoryCluster
from extender.service import SYNC_KINDS, ExtenderService, handlers_for
from tests.support.machines import hgx_h100
from tests.support.pods import filter_args, pod_manifest
from topology.accounting import accumulate
from topology.scheduling import GpuGrant


def _replica(config: ExtenderConfig, cluster: InMemoryCluster, pods_lag: bool = False) -> ExtenderService:
    svc = ExtenderService(config, cluster)
    handlers = handlers_for(svc)
    if pods_lag:  # the pod watch delivers nothing new: a replica seeing ledgers before pods
        handlers = replace(handlers, pod=lambda pod: None)
    cluster.run_watches(handlers, lambda: True)
    return svc


def _bind(svc: ExtenderService, created: dict[str, Any], node: str) -> str:
    m = created["metadata"]
    args = {"PodName": m["name"], "PodNamespace": m["namespace"], "PodUID": m["uid"], "Node": node}
    return str(svc.bind(args)["Error"])


def test_a_replica_whose_pod_watch_lags_keeps_the_other_replicas_fresh_commit(
    service: ExtenderService, cluster: InMemoryCluster, config: ExtenderConfig
) -> None:
    """Replica B sees A's new ledger entry before the pod: it reads the pod and keeps the entry."""
    lagging = _replica(config, cluster, pods_lag=True)
    created = cluster.create_pod(pod_manifest("fresh", gpus=2))
    assert _bind(service, created, "nv-node") == ""
    assert created["metadata"]["uid"] not in lagging.store.snapshot().pods
    assert reconcile_once(lagging) == 0
    assert [e.name for e in cluster.read_ledger("nv-node").entries] == ["fresh"]


def test_a_lagging_replica_still_releases_what_is_really_gone(
    service: ExtenderService, cluster: InMemoryCluster, config: ExtenderConfig
) -> None:
    """A pod deleted in the API is released by any replica, whatever its own view says."""
    lagging = _replica(config, cluster, pods_lag=True)
    assert _bind(service, cluster.create_pod(pod_manifest("done", gpus=1)), "nv-node") == ""
    cluster.delete_pod("ml", "done")
    assert reconcile_once(lagging) == 1
    assert cluster.read_ledger("nv-node").entries == ()


def test_binds_on_two_replicas_never_share_a_gpu(cluster: InMemoryCluster, config: ExtenderConfig) -> None:
    """Both replicas plan on their own (equally stale) views; the ledger's compare-and-swap
    makes the later commit re-plan, so eight 1-GPU pods take eight different GPUs."""
    a, b = _replica(config, cluster), _replica(config, cluster)
    pods = [cluster.create_pod(pod_manifest(f"p{i}", gpus=1)) for i in range(8)]
    for pod in pods:  # both filter first: each view shows the node empty
        for svc in (a, b):
            assert svc.filter(filter_args(pod, ["nv-node"]))["NodeNames"] == ["nv-node"]
    for i, pod in enumerate(pods):
        assert _bind((a, b)[i % 2], pod, "nv-node") == ""
    ledger = cluster.read_ledger("nv-node")
    indices = sorted(g.index for g in ledger.grants())
    assert indices == list(range(8))
    assert accumulate(hgx_h100(), list(ledger.grants()), config.units_per_gpu)[1] == ()
    ninth = cluster.create_pod(pod_manifest("p8", gpus=1))
    assert _bind(a, ninth, "nv-node").startswith("node nv-node: ")


def test_a_retried_bind_renews_the_dead_replicas_commit_before_using_it(
    service: ExtenderService, cluster: InMemoryCluster, config: ExtenderConfig
) -> None:
    """A replica died between commit and Binding; the retried bind on the other replica renews
    the entry by compare-and-swap, so a release decided on the old entry leaves it alone."""
    created = cluster.create_pod(pod_manifest("orphan", gpus=1))
    uid = created["metadata"]["uid"]
    old = LedgerEntry(uid, "ml", "orphan", Allocation("nv-node", (GpuGrant(3, "GPU-hgx-h100-3", True),)), 1.0)
    cluster.write_ledger(cluster.read_ledger("nv-node").with_entry(old))
    assert _bind(service, created, "nv-node") == ""
    (renewed,) = cluster.read_ledger("nv-node").entries
    assert renewed.allocation == old.allocation and renewed.reserved_at > old.reserved_at
    assert cluster.read_pod("ml", "orphan").tracked.node_name == "nv-node"
    # a release decided on the entry as it was before the renewal keeps the renewed one
    assert not service.binder.release("nv-node", uid, expected=old)
    assert cluster.read_ledger("nv-node").entries == (renewed,)


def test_a_release_that_wins_the_race_makes_the_retried_bind_place_afresh(
    service: ExtenderService, cluster: InMemoryCluster, config: ExtenderConfig
) -> None:
    """The other order: the stale entry is released first; the bind's renewal then conflicts
    with the released ledger, and the pod is placed on what the ledger holds now."""
    other = _replica(config, cluster)
    created = cluster.create_pod(pod_manifest("late", gpus=1))
    uid = created["metadata"]["uid"]
    old = LedgerEntry(uid, "ml", "late", Allocation("nv-node", (GpuGrant(5, "GPU-hgx-h100-5", True),)), 1.0)
    cluster.write_ledger(cluster.read_ledger("nv-node").with_entry(old))
    cached = service.store.snapshot().ledger("nv-node")  # the binding replica's view: entry present
    assert other.binder.release("nv-node", uid, expected=old)
    service.store.apply_ledger(cached)  # its watch has not delivered the release yet
    assert _bind(service, created, "nv-node") == ""
    (entry,) = cluster.read_ledger("nv-node").entries
    assert entry.pod_uid == uid and entry.reserved_at > old.reserved_at
    assert cluster.read_pod("ml", "late").tracked.node_name == "nv-node"


def test_a_starting_replica_is_ready_only_once_every_watch_has_listed(
    cluster: InMemoryCluster, config: ExtenderConfig
) -> None:
    """Readiness (what the Service routes by) waits for the initial list of every kind: a
    replica that knows the nodes but not yet the ledgers would place on GPUs already taken."""
    svc = ExtenderService(config, cluster)
    for kind in SYNC_KINDS:
        assert not svc.ready(), f"ready before {kind} listed"
        svc.store.mark_synced(kind)
    assert svc.ready()
