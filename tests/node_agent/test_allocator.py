"""Matching kubelet requests to allocation records: order, agreement, capacity, concurrency."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from node_agent.deviceplugin.allocator import AllocatorState, capacity_conflict, preferred_ids
from node_agent.deviceplugin.broker import AllocationBroker, AllocationRefused
from node_agent.deviceplugin.container_spec import ENV_VISIBLE_DEVICES
from node_agent.deviceplugin.inventory import (
    SHARED_GPU_RESOURCE,
    WHOLE_GPU_RESOURCE,
    mig_resource,
    share_unit_id,
)
from node_agent.deviceplugin.ledger import ContainerDemand, InMemoryPodLedger, LedgerError
from node_agent.deviceplugin.records import read_records
from topology.allocation import CONSUMED_ANNOTATION, decode_consumption

from .builders import MIG_PROFILE, inventory, mig, mig_uuid, pod, share, uuid, whole


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def broker_for(*pods, gpus: int = 4, mig_gpus: tuple[int, ...] = (), grace_s: float = 60.0):
    ledger = InMemoryPodLedger(pods)
    clock = Clock()
    broker = AllocationBroker(
        inventory(gpus, mig_gpus=mig_gpus), ledger, clock=clock, departure_grace_s=grace_s
    )
    return broker, ledger, clock


def visible(spec) -> list[str]:
    return spec.env(ENV_VISIBLE_DEVICES).split(",")


def consumed(ledger: InMemoryPodLedger, name: str):
    text = ledger.pod(f"uid-{name}").annotations.get(CONSUMED_ANNOTATION)
    return decode_consumption(text) if text else None


def test_the_oldest_bound_record_of_the_requested_size_is_served_first() -> None:
    broker, ledger, _ = broker_for(
        pod("young", whole(2, 3), bound_at=20),
        pod("old", whole(0, 1), bound_at=10),
        pod("one", whole(3), bound_at=5),
    )
    spec = broker.allocate(WHOLE_GPU_RESOURCE, ["x", "y"])
    assert visible(spec) == [uuid(0), uuid(1)]
    assert consumed(ledger, "old").containers == ("main",)
    assert consumed(ledger, "young") is None


def test_a_record_whose_devices_the_kubelet_passed_wins_over_an_older_one() -> None:
    broker, ledger, _ = broker_for(
        pod("old", whole(0, 1), bound_at=10), pod("young", whole(2, 3), bound_at=20)
    )
    spec = broker.allocate(WHOLE_GPU_RESOURCE, [uuid(3), uuid(2)])
    assert visible(spec) == [uuid(2), uuid(3)]
    assert consumed(ledger, "young") is not None and consumed(ledger, "old") is None
    assert broker.counters.id_mismatches == 0


def test_kubelet_ids_that_differ_from_the_record_still_get_the_records_gpus_and_are_counted() -> None:
    broker, ledger, _ = broker_for(pod("p", whole(1)))
    spec = broker.allocate(WHOLE_GPU_RESOURCE, [uuid(3)])
    assert visible(spec) == [uuid(1)]
    assert broker.counters.id_mismatches == 1
    assert consumed(ledger, "p").device_ids == (uuid(3),)


def test_each_record_is_consumed_once_and_then_requests_are_refused() -> None:
    broker, _, _ = broker_for(pod("a", whole(0)), pod("b", whole(1), bound_at=1))
    got = [visible(broker.allocate(WHOLE_GPU_RESOURCE, ["any"]))[0] for _ in range(2)]
    assert got == [uuid(0), uuid(1)]
    with pytest.raises(AllocationRefused, match="no Linkpack allocation record"):
        broker.allocate(WHOLE_GPU_RESOURCE, ["any"])
    assert broker.counters.refusals == 1


def test_the_requested_amount_must_equal_the_records_amount() -> None:
    broker, _, _ = broker_for(pod("two", whole(0, 1)))
    with pytest.raises(AllocationRefused):
        broker.allocate(WHOLE_GPU_RESOURCE, [uuid(0)])


def test_a_record_overlapping_gpus_already_handed_out_is_never_served() -> None:
    # two records claim GPU 1 (a stale or buggy extender): only one of them may be served
    broker, _, _ = broker_for(
        pod("a", whole(1)), pod("b", whole(1), bound_at=1), pod("c", share(1, 1024, 10))
    )
    assert visible(broker.allocate(WHOLE_GPU_RESOURCE, [uuid(1)])) == [uuid(1)]
    with pytest.raises(AllocationRefused):
        broker.allocate(WHOLE_GPU_RESOURCE, [uuid(1)])
    with pytest.raises(AllocationRefused):
        broker.allocate(SHARED_GPU_RESOURCE, [share_unit_id(uuid(1), k) for k in range(10)])


def test_shares_are_served_until_the_gpus_memory_or_units_run_out() -> None:
    pods = [pod(f"s{i}", share(0, 30000, 30), bound_at=i) for i in range(3)]
    broker, _, _ = broker_for(*pods)
    ids = [share_unit_id(uuid(0), k) for k in range(30)]
    broker.allocate(SHARED_GPU_RESOURCE, ids)
    broker.allocate(SHARED_GPU_RESOURCE, ids)
    with pytest.raises(AllocationRefused):  # 90000 MiB > 81920 MiB
        broker.allocate(SHARED_GPU_RESOURCE, ids)


def test_capacity_conflict_explains_units_and_mig() -> None:
    inv = inventory(2, mig_gpus=(1,))
    assert capacity_conflict(share(0, 10, 101), ("x", 1), (), inv) is not None
    assert capacity_conflict(mig(1, 0), ("x", 1), (), inv) is None
    assert "not on this node" in (capacity_conflict(mig(1, 9), ("x", 1), (), inv) or "")
    assert "not offered" in (capacity_conflict(whole(1), ("x", 1), (), inv) or "")


def test_mig_requests_get_the_mig_instance_of_the_record() -> None:
    broker, _, _ = broker_for(pod("m", mig(1, 1)), gpus=2, mig_gpus=(1,))
    spec = broker.allocate(mig_resource(MIG_PROFILE), [mig_uuid(1, 0)])
    assert visible(spec) == [mig_uuid(1, 1)]
    assert spec.env("LINKPACK_ENFORCEMENT") == "mig"


def test_multi_container_pods_get_consecutive_slices_in_container_order() -> None:
    containers = (
        ContainerDemand("init", ((WHOLE_GPU_RESOURCE, 2),), init=True),
        ContainerDemand("a", ((WHOLE_GPU_RESOURCE, 1),)),
        ContainerDemand("b", ((WHOLE_GPU_RESOURCE, 1),)),
    )
    broker, ledger, _ = broker_for(pod("multi", whole(2, 3), containers))
    assert visible(broker.allocate(WHOLE_GPU_RESOURCE, [uuid(2), uuid(3)])) == [uuid(2), uuid(3)]
    assert visible(broker.allocate(WHOLE_GPU_RESOURCE, [uuid(2)])) == [uuid(2)]
    assert visible(broker.allocate(WHOLE_GPU_RESOURCE, [uuid(3)])) == [uuid(3)]
    assert consumed(ledger, "multi").containers == ("init", "a", "b")
    assert broker.counters.id_mismatches == 0


def test_share_containers_split_the_records_memory_by_their_units() -> None:
    containers = (
        ContainerDemand("a", ((SHARED_GPU_RESOURCE, 10),)),
        ContainerDemand("b", ((SHARED_GPU_RESOURCE, 30),)),
    )
    broker, _, _ = broker_for(pod("duo", share(2, 8000, 40), containers))
    a = broker.allocate(SHARED_GPU_RESOURCE, [share_unit_id(uuid(2), k) for k in range(10)])
    b = broker.allocate(SHARED_GPU_RESOURCE, [share_unit_id(uuid(2), k) for k in range(10, 40)])
    assert (a.env("LINKPACK_MEMORY_LIMIT_MIB"), b.env("LINKPACK_MEMORY_LIMIT_MIB")) == ("2000", "6000")
    assert (a.env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), b.env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")) == (
        "10",
        "30",
    )


def test_a_record_that_does_not_fit_the_pods_requests_is_skipped_and_reported() -> None:
    bad = pod("bad", whole(0, 1), amount=3)
    records, problems = read_records([bad], inventory())
    assert records == ()
    assert "pod requests 3" in problems[0].reason


def test_preferred_allocation_returns_the_records_devices_when_available() -> None:
    broker, _, _ = broker_for(pod("p", whole(3, 1)))
    available = [uuid(2), uuid(3), uuid(0), uuid(1)]
    assert broker.preferred(WHOLE_GPU_RESOURCE, available, [], 2) == (uuid(3), uuid(1))


def test_preferred_allocation_for_shares_picks_units_of_the_records_gpu() -> None:
    broker, _, _ = broker_for(pod("p", share(2, 1000, 3)))
    available = [share_unit_id(uuid(g), k) for k in (5, 1, 0, 7) for g in (0, 2)]
    picked = broker.preferred(SHARED_GPU_RESOURCE, available, [], 3)
    assert picked == tuple(share_unit_id(uuid(2), k) for k in (0, 1, 5))


def test_preferred_allocation_falls_back_to_the_next_record_then_to_a_stable_order() -> None:
    inv = inventory()
    records, _ = read_records([pod("old", whole(0), bound_at=1), pod("new", whole(1), bound_at=2)], inv)
    state = AllocatorState()
    assert preferred_ids(WHOLE_GPU_RESOURCE, [uuid(2), uuid(1)], [], 1, records, state, inv) == (uuid(1),)
    assert preferred_ids(WHOLE_GPU_RESOURCE, [uuid(3), uuid(2)], [], 1, (), state, inv) == (uuid(2),)
    must = preferred_ids(WHOLE_GPU_RESOURCE, [uuid(3), uuid(2)], [uuid(3)], 2, records, state, inv)
    assert must[0] == uuid(3) and len(must) == 2


def test_departed_pods_free_their_gpus_after_the_grace_period() -> None:
    broker, ledger, clock = broker_for(pod("a", whole(0)), grace_s=30)
    broker.allocate(WHOLE_GPU_RESOURCE, [uuid(0)])
    ledger.remove("uid-a")
    ledger.put(pod("b", whole(0), bound_at=50))
    broker.reconcile()
    with pytest.raises(AllocationRefused):  # the listing may lag: not released yet
        broker.allocate(WHOLE_GPU_RESOURCE, [uuid(0)])
    clock.now += 31
    broker.reconcile()
    assert visible(broker.allocate(WHOLE_GPU_RESOURCE, [uuid(0)])) == [uuid(0)]


def test_resync_after_a_restart_keeps_consumed_records_consumed() -> None:
    broker, ledger, _ = broker_for(pod("a", whole(0)), pod("b", whole(1), bound_at=1))
    broker.allocate(WHOLE_GPU_RESOURCE, [uuid(0)])
    restarted = AllocationBroker(inventory(), ledger, clock=Clock())
    restarted.resync()
    assert visible(restarted.allocate(WHOLE_GPU_RESOURCE, [uuid(0)])) == [uuid(1)]
    assert len(restarted.state.holdings) == 2


def test_failed_write_backs_are_retried_on_reconcile() -> None:
    broker, ledger, _ = broker_for(pod("a", whole(0)))
    ledger.fail_writes = True
    broker.allocate(WHOLE_GPU_RESOURCE, [uuid(0)])
    assert broker.counters.write_failures == 1 and consumed(ledger, "a") is None
    ledger.fail_writes = False
    broker.reconcile()
    assert consumed(ledger, "a").containers == ("main",)


def test_an_unreadable_pod_list_refuses_allocate_but_not_preferred() -> None:
    class Broken(InMemoryPodLedger):
        def list_bound_pods_on_node(self):
            raise LedgerError("apiserver down")

    broker = AllocationBroker(inventory(), Broken())
    assert broker.preferred(WHOLE_GPU_RESOURCE, [uuid(1), uuid(0)], [], 1) == (uuid(0),)
    with pytest.raises(AllocationRefused, match="apiserver down"):
        broker.allocate(WHOLE_GPU_RESOURCE, [uuid(0)])


def test_concurrent_requests_never_over_allocate_and_consume_each_record_once() -> None:
    # 12 pods want GPU 2 or 3 whole (6 records each), 8 pods want 30-unit shares of GPU 0 or 1:
    # at most 2 whole and 6 shares (3 per GPU by units) may be served.
    pods = [pod(f"w{i}", whole(2 + i % 2), bound_at=i) for i in range(12)]
    pods += [pod(f"s{i}", share(i % 2, 20000, 30), bound_at=100 + i) for i in range(8)]
    broker, ledger, _ = broker_for(*pods)
    results: list[tuple[str, str]] = []
    lock = threading.Lock()
    start = threading.Barrier(20)

    def ask(resource: str, ids: list[str]) -> None:
        start.wait()
        try:
            spec = broker.allocate(resource, ids)
            outcome = spec.env(ENV_VISIBLE_DEVICES)
        except AllocationRefused:
            outcome = "refused"
        with lock:
            results.append((resource, outcome))

    threads = [threading.Thread(target=ask, args=(WHOLE_GPU_RESOURCE, [uuid(i % 4)])) for i in range(12)]
    threads += [
        threading.Thread(
            target=ask, args=(SHARED_GPU_RESOURCE, [share_unit_id(uuid(0), k) for k in range(30)])
        )
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    whole_given = Counter(v for r, v in results if r == WHOLE_GPU_RESOURCE and v != "refused")
    shares_given = Counter(v for r, v in results if r == SHARED_GPU_RESOURCE and v != "refused")
    assert whole_given == {uuid(2): 1, uuid(3): 1}
    assert shares_given == {uuid(0): 3, uuid(1): 3}  # 3 x 30 units fit, 4 x 20000 MiB would too
    keys = [h.slot.key for h in broker.state.handouts]
    assert len(keys) == len(set(keys)) == 8
    assert sum(1 for p in ledger.list_bound_pods_on_node() if CONSUMED_ANNOTATION in p.annotations) == 8


def test_app_containers_get_the_pods_gpus_the_kubelet_hands_them_from_the_init_container() -> None:
    containers = (
        ContainerDemand("init", ((WHOLE_GPU_RESOURCE, 2),), init=True),
        ContainerDemand("a", ((WHOLE_GPU_RESOURCE, 1),)),
        ContainerDemand("b", ((WHOLE_GPU_RESOURCE, 1),)),
    )
    broker, _, _ = broker_for(pod("multi", whole(2, 3), containers))
    broker.allocate(WHOLE_GPU_RESOURCE, [uuid(2), uuid(3)])
    assert visible(broker.allocate(WHOLE_GPU_RESOURCE, [uuid(3)])) == [uuid(3)]  # a: the kubelet's pick
    assert visible(broker.allocate(WHOLE_GPU_RESOURCE, [uuid(0)])) == [uuid(2)]  # b: a stray ID, the one left
    assert broker.counters.id_mismatches == 1


def test_two_app_containers_never_get_the_same_gpu_of_their_pod() -> None:
    containers = (
        ContainerDemand("a", ((WHOLE_GPU_RESOURCE, 1),)),
        ContainerDemand("b", ((WHOLE_GPU_RESOURCE, 1),)),
    )
    broker, _, _ = broker_for(pod("pair", whole(0, 1), containers))
    assert visible(broker.allocate(WHOLE_GPU_RESOURCE, [uuid(1)])) == [uuid(1)]
    assert visible(broker.allocate(WHOLE_GPU_RESOURCE, [uuid(1)])) == [uuid(0)]
