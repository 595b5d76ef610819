"""Reconciling handouts with the kubelet's pod-resources account: swaps, holders, adoption."""

from __future__ import annotations

import pytest

from node_agent.deviceplugin.broker import AllocationBroker, AllocationRefused
from node_agent.deviceplugin.container_spec import ENV_VISIBLE_DEVICES
from node_agent.deviceplugin.inventory import SHARED_GPU_RESOURCE, WHOLE_GPU_RESOURCE, share_unit_id
from node_agent.deviceplugin.ledger import ContainerDemand, InMemoryPodLedger
from node_agent.deviceplugin.reconcile import KubeletAssignment
from topology.allocation import (
    ALLOCATION_ANNOTATION,
    CONSUMED_ANNOTATION,
    decode_allocation,
    decode_consumption,
)

from .builders import inventory, pod, share, uuid, whole


def record(ledger: InMemoryPodLedger, name: str):
    return decode_allocation(ledger.pod(f"uid-{name}").annotations[ALLOCATION_ANNOTATION])


def consumed(ledger: InMemoryPodLedger, name: str):
    text = ledger.pod(f"uid-{name}").annotations.get(CONSUMED_ANNOTATION)
    return decode_consumption(text) if text else None


def kubelet_says(name: str, resource: str, *ids: str, container: str = "main") -> KubeletAssignment:
    return KubeletAssignment("default", name, container, resource, ids)


def test_a_container_that_got_another_pods_record_makes_the_two_records_swap() -> None:
    ledger = InMemoryPodLedger([pod("a", whole(0), bound_at=1), pod("b", whole(1), bound_at=2)])
    broker = AllocationBroker(inventory(), ledger)
    # the kubelet admits b first and passes devices that match no record: a (oldest) is guessed
    first = broker.allocate(WHOLE_GPU_RESOURCE, [uuid(3)])
    assert first.env(ENV_VISIBLE_DEVICES) == uuid(0)

    outcome = broker.reconcile([kubelet_says("b", WHOLE_GPU_RESOURCE, uuid(3))])
    assert outcome is not None and len(outcome.swapped) == 1
    assert record(ledger, "b").gpu_uuids == (uuid(0),) and record(ledger, "b").generation == 2
    assert consumed(ledger, "b").containers == ("main",) and consumed(ledger, "b").generation == 2
    assert record(ledger, "a").gpu_uuids == (uuid(1),) and consumed(ledger, "a") is None

    second = broker.allocate(WHOLE_GPU_RESOURCE, [uuid(2)])  # now a is admitted
    assert second.env(ENV_VISIBLE_DEVICES) == uuid(1)
    assert consumed(ledger, "a").containers == ("main",) and consumed(ledger, "a").generation == 2
    confirm = broker.reconcile(
        [kubelet_says("b", WHOLE_GPU_RESOURCE, uuid(3)), kubelet_says("a", WHOLE_GPU_RESOURCE, uuid(2))]
    )
    assert confirm is not None and confirm.confirmed == 2 and confirm.swapped == ()
    assert broker.counters.swaps == 1


def test_a_swap_also_works_when_both_pods_were_admitted_crosswise() -> None:
    ids_a = [share_unit_id(uuid(3), k) for k in range(20)]
    ids_b = [share_unit_id(uuid(3), k) for k in range(20, 40)]
    ledger = InMemoryPodLedger(
        [pod("a", share(0, 4000, 20), bound_at=1), pod("b", share(1, 6000, 20), bound_at=2)]
    )
    broker = AllocationBroker(inventory(), ledger)
    broker.allocate(SHARED_GPU_RESOURCE, ids_b)  # really b, matched to a
    broker.allocate(SHARED_GPU_RESOURCE, ids_a)  # really a, matched to b
    broker.reconcile(
        [kubelet_says("a", SHARED_GPU_RESOURCE, *ids_a), kubelet_says("b", SHARED_GPU_RESOURCE, *ids_b)]
    )
    assert record(ledger, "a").gpu_uuids == (uuid(1),) and record(ledger, "b").gpu_uuids == (uuid(0),)
    assert consumed(ledger, "a").device_ids == tuple(ids_a) and consumed(ledger, "b").device_ids == tuple(
        ids_b
    )
    assert record(ledger, "a").resources == (("nvidia.com/gpu.shared", 20),)


def test_when_shapes_differ_the_pod_that_has_the_gpus_becomes_their_holder() -> None:
    containers = (
        ContainerDemand("x", ((WHOLE_GPU_RESOURCE, 1),)),
        ContainerDemand("y", ((SHARED_GPU_RESOURCE, 5),)),
    )
    odd = pod("odd", whole(2) + share(1, 100, 5), containers, bound_at=5)
    ledger = InMemoryPodLedger([pod("a", whole(0), bound_at=1), odd])
    broker = AllocationBroker(inventory(), ledger, departure_grace_s=0)
    broker.allocate(WHOLE_GPU_RESOURCE, [uuid(3)])  # really odd's container x, matched to a
    outcome = broker.reconcile([kubelet_says("odd", WHOLE_GPU_RESOURCE, uuid(3), container="x")])
    assert outcome is not None and outcome.swapped == () and len(outcome.unresolved) == 1
    ledger.remove("uid-a")  # a goes away; odd still uses GPU 0, so it stays taken
    ledger.put(pod("c", whole(0), bound_at=9))
    broker.reconcile()
    # c's record cannot be served; the only record left that fits is odd's own (GPU 2)
    assert broker.allocate(WHOLE_GPU_RESOURCE, [uuid(0)]).env(ENV_VISIBLE_DEVICES) == uuid(2)
    with pytest.raises(AllocationRefused):
        broker.allocate(WHOLE_GPU_RESOURCE, [uuid(0)])


def test_handouts_lost_by_a_restart_are_adopted_from_the_kubelets_account() -> None:
    ledger = InMemoryPodLedger([pod("a", whole(0), bound_at=1), pod("b", whole(0), bound_at=2)])
    broker = AllocationBroker(inventory(), ledger)  # a runs on GPU 0, but nothing was written back
    outcome = broker.reconcile([kubelet_says("a", WHOLE_GPU_RESOURCE, uuid(0))])
    assert outcome is not None and outcome.adopted == 1
    with pytest.raises(AllocationRefused):  # b's record overlaps a's
        broker.allocate(WHOLE_GPU_RESOURCE, [uuid(0)])


def test_assignments_of_pods_without_records_are_left_alone() -> None:
    ledger = InMemoryPodLedger([pod("a", whole(0), bound_at=1)])
    broker = AllocationBroker(inventory(), ledger)
    outcome = broker.reconcile([kubelet_says("stranger", WHOLE_GPU_RESOURCE, uuid(2))])
    assert outcome is not None and (outcome.adopted, outcome.confirmed, outcome.swapped) == (0, 0, ())


def test_a_swap_whose_rewrite_failed_is_written_before_the_consumed_annotation_that_follows_it() -> None:
    ledger = InMemoryPodLedger([pod("a", whole(0), bound_at=1), pod("b", whole(1), bound_at=2)])
    broker = AllocationBroker(inventory(), ledger)
    broker.allocate(WHOLE_GPU_RESOURCE, [uuid(3)])  # really b, matched to a
    ledger.fail_writes = True
    broker.reconcile([kubelet_says("b", WHOLE_GPU_RESOURCE, uuid(3))])
    assert record(ledger, "a").generation == 1  # not written yet
    # a, from memory
    assert broker.allocate(WHOLE_GPU_RESOURCE, [uuid(2)]).env(ENV_VISIBLE_DEVICES) == uuid(1)
    ledger.fail_writes = False
    broker.reconcile()
    assert record(ledger, "a").gpu_uuids == (uuid(1),) and consumed(ledger, "a").generation == 2
    assert record(ledger, "b").gpu_uuids == (uuid(0),) and consumed(ledger, "b").generation == 2
