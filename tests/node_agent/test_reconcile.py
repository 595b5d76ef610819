"""Reconciling handouts with the kubelet's pod-resources account: swaps, holders, adoption."""

from __future__ import annotations

import pytest

from contract.allocation import decode_allocation, decode_consumption
from contract.keys import ALLOCATION_ANNOTATION, CONSUMED_ANNOTATION
from node_agent.deviceplugin.broker import AllocationBroker, AllocationRefused
from node_agent.deviceplugin.container_spec import ENV_VISIBLE_DEVICES
from node_agent.deviceplugin.inventory import share_unit_id
from node_agent.deviceplugin.reconcile import KubeletAssignment
from node_agent.deviceplugin.record_store import InMemoryPodRecords
from tests.support.device_plugin import app, bound_pod, inventory, share, uuid, whole
from tests.support.resources import GPU, SHARED


def record(store: InMemoryPodRecords, name: str):
    return decode_allocation(store.pod(f"uid-{name}").annotations[ALLOCATION_ANNOTATION])


def consumed(store: InMemoryPodRecords, name: str):
    text = store.pod(f"uid-{name}").annotations.get(CONSUMED_ANNOTATION)
    return decode_consumption(text) if text else None


def kubelet_says(name: str, resource: str, *ids: str, container: str = "main") -> KubeletAssignment:
    return KubeletAssignment("default", name, container, resource, ids)


def test_a_container_that_got_another_pods_record_makes_the_two_records_swap() -> None:
    """A container that got another pod's record makes the two records swap, then both are confirmed."""
    store = InMemoryPodRecords([bound_pod("a", whole(0), bound_at=1), bound_pod("b", whole(1), bound_at=2)])
    broker = AllocationBroker(inventory(), store)
    # the kubelet admits b first and passes devices that match no record: a (oldest) is guessed
    first = broker.allocate(GPU, [uuid(3)])
    assert first.env(ENV_VISIBLE_DEVICES) == uuid(0)

    outcome = broker.reconcile([kubelet_says("b", GPU, uuid(3))])
    assert outcome is not None and len(outcome.swapped) == 1
    assert record(store, "b").gpu_uuids == (uuid(0),) and record(store, "b").generation == 2
    assert consumed(store, "b").containers == ("main",) and consumed(store, "b").generation == 2
    assert record(store, "a").gpu_uuids == (uuid(1),) and consumed(store, "a") is None

    second = broker.allocate(GPU, [uuid(2)])  # now a is admitted
    assert second.env(ENV_VISIBLE_DEVICES) == uuid(1)
    assert consumed(store, "a").containers == ("main",) and consumed(store, "a").generation == 2
    confirm = broker.reconcile([kubelet_says("b", GPU, uuid(3)), kubelet_says("a", GPU, uuid(2))])
    assert confirm is not None and confirm.confirmed == 2 and confirm.swapped == ()
    assert broker.counters.swaps == 1


def test_a_swap_also_works_when_both_pods_were_admitted_crosswise() -> None:
    """Two share pods admitted crosswise end with records matching the devices they got."""
    ids_a = [share_unit_id(uuid(3), k) for k in range(20)]
    ids_b = [share_unit_id(uuid(3), k) for k in range(20, 40)]
    store = InMemoryPodRecords(
        [bound_pod("a", share(0, 4000, 20), bound_at=1), bound_pod("b", share(1, 6000, 20), bound_at=2)]
    )
    broker = AllocationBroker(inventory(), store)
    broker.allocate(SHARED, ids_b)  # really b, matched to a
    broker.allocate(SHARED, ids_a)  # really a, matched to b
    broker.reconcile([kubelet_says("a", SHARED, *ids_a), kubelet_says("b", SHARED, *ids_b)])
    assert record(store, "a").gpu_uuids == (uuid(1),) and record(store, "b").gpu_uuids == (uuid(0),)
    assert consumed(store, "a").device_ids == tuple(ids_a) and consumed(store, "b").device_ids == tuple(ids_b)
    assert record(store, "a").resources == ((SHARED, 20),)


def test_when_shapes_differ_the_pod_that_has_the_gpus_becomes_their_holder() -> None:
    """When the two records differ in shape, the pod that has the GPUs becomes their holder."""
    containers = (
        app("x", GPU, 1),
        app("y", SHARED, 5),
    )
    odd = bound_pod("odd", whole(2) + share(1, 100, 5), containers, bound_at=5)
    store = InMemoryPodRecords([bound_pod("a", whole(0), bound_at=1), odd])
    broker = AllocationBroker(inventory(), store, departure_grace_s=0)
    broker.allocate(GPU, [uuid(3)])  # really odd's container x, matched to a
    outcome = broker.reconcile([kubelet_says("odd", GPU, uuid(3), container="x")])
    assert outcome is not None and outcome.swapped == () and len(outcome.unresolved) == 1
    store.remove("uid-a")  # a goes away; odd still uses GPU 0, so it stays taken
    store.put(bound_pod("c", whole(0), bound_at=9))
    broker.reconcile()
    # c's record cannot be served; the only record left that fits is odd's own (GPU 2)
    assert broker.allocate(GPU, [uuid(0)]).env(ENV_VISIBLE_DEVICES) == uuid(2)
    with pytest.raises(AllocationRefused):
        broker.allocate(GPU, [uuid(0)])


def test_handouts_lost_by_a_restart_are_adopted_from_the_kubelets_account() -> None:
    """Handouts lost by a restart are adopted from the kubelet's account."""
    store = InMemoryPodRecords([bound_pod("a", whole(0), bound_at=1), bound_pod("b", whole(0), bound_at=2)])
    broker = AllocationBroker(inventory(), store)  # a runs on GPU 0, but nothing was written back
    outcome = broker.reconcile([kubelet_says("a", GPU, uuid(0))])
    assert outcome is not None and outcome.adopted == 1
    with pytest.raises(AllocationRefused):  # b's record overlaps a's
        broker.allocate(GPU, [uuid(0)])


def test_assignments_of_pods_without_records_are_left_alone() -> None:
    """The kubelet's assignments to pods without records are left alone."""
    store = InMemoryPodRecords([bound_pod("a", whole(0), bound_at=1)])
    broker = AllocationBroker(inventory(), store)
    outcome = broker.reconcile([kubelet_says("stranger", GPU, uuid(2))])
    assert outcome is not None and (outcome.adopted, outcome.confirmed, outcome.swapped) == (0, 0, ())


def test_a_swap_whose_rewrite_failed_is_written_before_the_consumed_annotation_that_follows_it() -> None:
    """A swap whose rewrite failed is written before the consumed annotation that depends on it."""
    store = InMemoryPodRecords([bound_pod("a", whole(0), bound_at=1), bound_pod("b", whole(1), bound_at=2)])
    broker = AllocationBroker(inventory(), store)
    broker.allocate(GPU, [uuid(3)])  # really b, matched to a
    store.fail_writes = True
    broker.reconcile([kubelet_says("b", GPU, uuid(3))])
    assert record(store, "a").generation == 1  # not written yet
    # a, from memory
    assert broker.allocate(GPU, [uuid(2)]).env(ENV_VISIBLE_DEVICES) == uuid(1)
    store.fail_writes = False
    broker.reconcile()
    assert record(store, "a").gpu_uuids == (uuid(1),) and consumed(store, "a").generation == 2
    assert record(store, "b").gpu_uuids == (uuid(0),) and consumed(store, "b").generation == 2
