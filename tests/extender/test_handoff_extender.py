"""The extender's side of the hand-off (`contract.handoff`): a departed pod's GPUs are not free
while the node still holds them or has not looked since the departure, GPUs the node holds
for pods the ledger no longer carries are not free, and a node not admitting gets no pods."""

from __future__ import annotations

from dataclasses import replace

from contract.gpu_topology import as_published
from contract.handoff import HeldPod, NodeHolds
from extender.binding.reconciler import reconcile_once
from extender.kube.in_memory import InMemoryCluster
from extender.service import ExtenderService
from tests.support.machines import hgx_h100
from tests.support.pods import filter_args, pod_manifest
from topology.scheduling import GpuGrant

from .test_service import _bind


def _publish_holds(cluster: InMemoryCluster, holds: NodeHolds | None) -> None:
    record = as_published("nv-node", hgx_h100())
    cluster.set_topology("nv-node", replace(record, status=replace(record.status, holds=holds)))


def _whole(n: int) -> tuple[GpuGrant, ...]:
    return tuple(GpuGrant(i, g.uuid, True) for i, g in enumerate(hgx_h100().gpus[:n]))


def test_a_deleted_pod_stays_on_the_ledger_while_the_node_holds_it(
    service: ExtenderService, cluster: InMemoryCluster
) -> None:
    """A force-deleted pod whose containers still run keeps its GPUs taken until the node, having
    looked after the deletion, no longer lists it."""
    _publish_holds(cluster, NodeHolds("0"))
    assert _bind(service, cluster, pod_manifest("gone", gpus=8), "nv-node") == ""
    uid = next(p["metadata"]["uid"] for p in cluster.pods() if p["metadata"]["name"] == "gone")
    cluster.delete_pod("ml", "gone")
    deleted_at = cluster.pods_revision
    _publish_holds(cluster, NodeHolds(deleted_at, (HeldPod("ml", "gone", uid, _whole(8)),)))
    assert reconcile_once(service) == 0
    assert service.filter(filter_args(pod_manifest(gpus=1), ["nv-node"]))["NodeNames"] == []
    _publish_holds(cluster, NodeHolds(str(int(deleted_at) - 1)))  # a look from before the deletion
    assert reconcile_once(service) == 0
    _publish_holds(cluster, NodeHolds(deleted_at))
    assert reconcile_once(service) == 1
    assert service.filter(filter_args(pod_manifest(gpus=8), ["nv-node"]))["NodeNames"] == ["nv-node"]


def test_gpus_held_for_a_pod_the_ledger_does_not_carry_are_not_free(
    service: ExtenderService, cluster: InMemoryCluster
) -> None:
    """What the kubelet still holds counts as taken even without a ledger entry."""
    _publish_holds(cluster, NodeHolds("1", (HeldPod("ml", "stray", "", _whole(6)),)))
    assert service.filter(filter_args(pod_manifest(gpus=4), ["nv-node"]))["NodeNames"] == []
    assert service.filter(filter_args(pod_manifest(gpus=2), ["nv-node"]))["NodeNames"] == ["nv-node"]


def test_a_node_whose_plugin_is_not_admitting_gets_no_pods(
    service: ExtenderService, cluster: InMemoryCluster
) -> None:
    """While the node agent drains (or cannot reach the kubelet) the node is left out."""
    _publish_holds(cluster, NodeHolds("1", admitting=False))
    assert service.filter(filter_args(pod_manifest(gpus=1), ["nv-node"]))["NodeNames"] == []
    _publish_holds(cluster, NodeHolds("2"))
    assert service.filter(filter_args(pod_manifest(gpus=1), ["nv-node"]))["NodeNames"] == ["nv-node"]
