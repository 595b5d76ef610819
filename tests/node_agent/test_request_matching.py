"""Matching kubelet requests to allocation records: order, agreement, capacity, concurrency."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import replace

import pytest

from contract.allocation import Enforcement, decode_consumption
from contract.keys import CONSUMED_ANNOTATION
from contract.pod_demand import ContainerDemand, ContainerRole
from contract.resources import ResourceNames
from node_agent.deviceplugin.broker import AllocationBroker, AllocationRefused
from node_agent.deviceplugin.container_spec import ENV_VISIBLE_DEVICES, SharingConfig
from node_agent.deviceplugin.inventory import share_unit_id
from node_agent.deviceplugin.record_store import InMemoryPodRecords, RecordStoreError
from node_agent.deviceplugin.records import read_records
from node_agent.deviceplugin.request_matching import HandoutState, capacity_conflict, preferred_ids
from tests.support.device_plugin import (
    MIG_GPU,
    app,
    bound_pod,
    init,
    inventory,
    mig,
    mig_uuid,
    share,
    sidecar,
    uuid,
    whole,
)
from tests.support.resources import GPU, SHARED


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def broker_for(*pods, gpus: int = 4, mig_gpus: tuple[int, ...] = (), grace_s: float = 60.0):
    store = InMemoryPodRecords(pods)
    clock = Clock()
    broker = AllocationBroker(
        inventory(gpus, mig_gpus=mig_gpus), store, clock=clock, departure_grace_s=grace_s
    )
    return broker, store, clock


def visible(spec) -> list[str]:
    return spec.env(ENV_VISIBLE_DEVICES).split(",")


def consumed(store: InMemoryPodRecords, name: str):
    text = store.pod(f"uid-{name}").annotations.get(CONSUMED_ANNOTATION)
    return decode_consumption(text) if text else None


def test_the_oldest_bound_record_of_the_requested_size_is_served_first() -> None:
    """Among records of the requested size, the one bound first is served first."""
    broker, store, _ = broker_for(
        bound_pod("young", whole(2, 3), bound_at=20),
        bound_pod("old", whole(0, 1), bound_at=10),
        bound_pod("one", whole(3), bound_at=5),
    )
    spec = broker.allocate(GPU, ["x", "y"])
    assert visible(spec) == [uuid(0), uuid(1)]
    assert consumed(store, "old").containers == ("main",)
    assert consumed(store, "young") is None


def test_a_record_whose_devices_the_kubelet_passed_wins_over_an_older_one() -> None:
    """A record whose own devices the kubelet passed wins over an older record of the same size."""
    broker, store, _ = broker_for(
        bound_pod("old", whole(0, 1), bound_at=10), bound_pod("young", whole(2, 3), bound_at=20)
    )
    spec = broker.allocate(GPU, [uuid(3), uuid(2)])
    assert visible(spec) == [uuid(2), uuid(3)]
    assert consumed(store, "young") is not None and consumed(store, "old") is None
    assert broker.counters.id_mismatches == 0


def test_kubelet_ids_that_differ_from_the_record_still_get_the_records_gpus_and_are_counted() -> None:
    """A container gets its record's GPUs even when the kubelet passed others, and the mismatch is counted."""
    broker, store, _ = broker_for(bound_pod("p", whole(1)))
    spec = broker.allocate(GPU, [uuid(3)])
    assert visible(spec) == [uuid(1)]
    assert broker.counters.id_mismatches == 1
    assert consumed(store, "p").device_ids == (uuid(3),)


def test_each_record_is_consumed_once_and_then_requests_are_refused() -> None:
    """Each record is handed out once; a request no record is left for is refused."""
    broker, _, _ = broker_for(bound_pod("a", whole(0)), bound_pod("b", whole(1), bound_at=1))
    got = [visible(broker.allocate(GPU, ["any"]))[0] for _ in range(2)]
    assert got == [uuid(0), uuid(1)]
    with pytest.raises(AllocationRefused, match="no Linkpack allocation record"):
        broker.allocate(GPU, ["any"])
    assert broker.counters.refusals == 1


def test_the_requested_amount_must_equal_the_records_amount() -> None:
    """A request for fewer devices than a record holds does not match that record."""
    broker, _, _ = broker_for(bound_pod("two", whole(0, 1)))
    with pytest.raises(AllocationRefused):
        broker.allocate(GPU, [uuid(0)])


def test_a_record_overlapping_gpus_already_handed_out_is_never_served() -> None:
    # two records claim GPU 1 (a stale or buggy extender): only one of them may be served
    """A record claiming a GPU already handed out is refused, whole or shared."""
    broker, _, _ = broker_for(
        bound_pod("a", whole(1)), bound_pod("b", whole(1), bound_at=1), bound_pod("c", share(1, 1024, 10))
    )
    assert visible(broker.allocate(GPU, [uuid(1)])) == [uuid(1)]
    with pytest.raises(AllocationRefused):
        broker.allocate(GPU, [uuid(1)])
    with pytest.raises(AllocationRefused):
        broker.allocate(SHARED, [share_unit_id(uuid(1), k) for k in range(10)])


def test_shares_are_served_until_the_gpus_memory_or_units_run_out() -> None:
    """Shares of one GPU are served until its memory would be exceeded."""
    pods = [bound_pod(f"s{i}", share(0, 30000, 30), bound_at=i) for i in range(3)]
    broker, _, _ = broker_for(*pods)
    ids = [share_unit_id(uuid(0), k) for k in range(30)]
    broker.allocate(SHARED, ids)
    broker.allocate(SHARED, ids)
    with pytest.raises(AllocationRefused):  # 90000 MiB > 81920 MiB
        broker.allocate(SHARED, ids)


def test_capacity_conflict_explains_units_and_mig() -> None:
    """A capacity conflict names too many units, an unknown MIG instance or a GPU not offered whole."""
    inv = inventory(2, mig_gpus=(1,))
    assert capacity_conflict(share(0, 10, 101), ("x", 1), (), inv) is not None
    assert capacity_conflict(mig(1, 0), ("x", 1), (), inv) is None
    assert "not on this node" in (capacity_conflict(mig(1, 9), ("x", 1), (), inv) or "")
    assert "not offered" in (capacity_conflict(whole(1), ("x", 1), (), inv) or "")


def test_mig_requests_get_the_mig_instance_of_the_record() -> None:
    """A MIG request gets the record's MIG instance, enforced by the hardware."""
    broker, _, _ = broker_for(bound_pod("m", mig(1, 1)), gpus=2, mig_gpus=(1,))
    spec = broker.allocate(MIG_GPU, [mig_uuid(1, 0)])
    assert visible(spec) == [mig_uuid(1, 1)]
    assert spec.env("LINKPACK_ENFORCEMENT") == "mig"


def test_multi_container_pods_get_consecutive_slices_in_container_order() -> None:
    """An init container gets the pod's GPUs and the app containers after it get consecutive slices."""
    containers = (
        init("init", GPU, 2),
        app("a", GPU, 1),
        app("b", GPU, 1),
    )
    broker, store, _ = broker_for(bound_pod("multi", whole(2, 3), containers))
    assert visible(broker.allocate(GPU, [uuid(2), uuid(3)])) == [uuid(2), uuid(3)]
    assert visible(broker.allocate(GPU, [uuid(2)])) == [uuid(2)]
    assert visible(broker.allocate(GPU, [uuid(3)])) == [uuid(3)]
    assert consumed(store, "multi").containers == ("init", "a", "b")
    assert broker.counters.id_mismatches == 0


def test_share_containers_split_the_records_memory_by_their_units(tmp_path) -> None:
    """Two containers sharing one record get its memory and MPS thread share in proportion to their units."""
    containers = (app("a", SHARED, 10), app("b", SHARED, 30))
    record = bound_pod("duo", share(2, 8000, 40), containers, enforcement=Enforcement.HARD_MPS)
    sharing = SharingConfig(mps_pipe_dir=str(tmp_path))
    broker = AllocationBroker(inventory(), InMemoryPodRecords([record]), sharing)
    a = broker.allocate(SHARED, [share_unit_id(uuid(2), k) for k in range(10)])
    b = broker.allocate(SHARED, [share_unit_id(uuid(2), k) for k in range(10, 40)])
    assert (a.env("LINKPACK_MEMORY_LIMIT_MIB"), b.env("LINKPACK_MEMORY_LIMIT_MIB")) == ("2000", "6000")
    assert (a.env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), b.env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")) == (
        "10",
        "30",
    )
    assert broker.counters.enforcement_disagreements == 0


def test_a_record_asking_for_mps_on_a_node_without_it_falls_back_to_cooperative_and_is_counted(
    tmp_path,
) -> None:
    """An MPS record on a node whose pipe directory is missing gets cooperative caps, said in the env and counted."""
    record = bound_pod("p", share(0, 4096, 25), enforcement=Enforcement.HARD_MPS)
    sharing = SharingConfig(mps_pipe_dir=str(tmp_path / "missing"))
    broker = AllocationBroker(inventory(), InMemoryPodRecords([record]), sharing)
    spec = broker.allocate(SHARED, [share_unit_id(uuid(0), k) for k in range(25)])
    assert spec.env("LINKPACK_ENFORCEMENT") == "cooperative" and spec.env("CUDA_MPS_PIPE_DIRECTORY") is None
    assert "no MPS pipe directory" in (spec.env("LINKPACK_ENFORCEMENT_FALLBACK") or "")
    assert spec.env("LINKPACK_MEMORY_LIMIT_MIB") == "4096"
    assert broker.counters.enforcement_disagreements == 1


def test_a_record_that_does_not_fit_the_pods_requests_is_skipped_and_reported() -> None:
    """A record granting another amount than the pod requests is skipped and reported."""
    bad = bound_pod("bad", whole(0, 1), amount=3)
    records, problems = read_records([bad], inventory())
    assert records == ()
    assert "pod requests 3" in problems[0].reason


def test_preferred_allocation_returns_the_records_devices_when_available() -> None:
    """The preferred allocation is the record's own devices when the kubelet offers them."""
    broker, _, _ = broker_for(bound_pod("p", whole(3, 1)))
    available = [uuid(2), uuid(3), uuid(0), uuid(1)]
    assert broker.preferred(GPU, available, [], 2) == (uuid(3), uuid(1))


def test_preferred_allocation_for_shares_picks_units_of_the_records_gpu() -> None:
    """For a share, the preferred allocation picks share units of the record's GPU in a stable order."""
    broker, _, _ = broker_for(bound_pod("p", share(2, 1000, 3)))
    available = [share_unit_id(uuid(g), k) for k in (5, 1, 0, 7) for g in (0, 2)]
    picked = broker.preferred(SHARED, available, [], 3)
    assert picked == tuple(share_unit_id(uuid(2), k) for k in (0, 1, 5))


def test_preferred_allocation_falls_back_to_the_next_record_then_to_a_stable_order() -> None:
    """Without the first record's devices the next record's are preferred, else a stable order."""
    inv = inventory()
    records, _ = read_records(
        [bound_pod("old", whole(0), bound_at=1), bound_pod("new", whole(1), bound_at=2)], inv
    )
    state = HandoutState()
    assert preferred_ids(GPU, [uuid(2), uuid(1)], [], 1, records, state, inv) == (uuid(1),)
    assert preferred_ids(GPU, [uuid(3), uuid(2)], [], 1, (), state, inv) == (uuid(2),)
    must = preferred_ids(GPU, [uuid(3), uuid(2)], [uuid(3)], 2, records, state, inv)
    assert must[0] == uuid(3) and len(must) == 2


def test_departed_pods_free_their_gpus_after_the_grace_period() -> None:
    """A departed pod's GPUs are freed only after the grace period, since the listing may lag."""
    broker, store, clock = broker_for(bound_pod("a", whole(0)), grace_s=30)
    broker.allocate(GPU, [uuid(0)])
    store.remove("uid-a")
    store.put(bound_pod("b", whole(0), bound_at=50))
    broker.reconcile()
    with pytest.raises(AllocationRefused):  # the listing may lag: not released yet
        broker.allocate(GPU, [uuid(0)])
    clock.now += 31
    broker.reconcile()
    assert visible(broker.allocate(GPU, [uuid(0)])) == [uuid(0)]


def test_resync_after_a_restart_keeps_consumed_records_consumed() -> None:
    """After a restart, records consumed in the API stay consumed and hold their GPUs."""
    broker, store, _ = broker_for(bound_pod("a", whole(0)), bound_pod("b", whole(1), bound_at=1))
    broker.allocate(GPU, [uuid(0)])
    restarted = AllocationBroker(inventory(), store, clock=Clock())
    restarted.resync()
    assert visible(restarted.allocate(GPU, [uuid(0)])) == [uuid(1)]
    assert len(restarted.state.claims) == 2


def test_failed_write_backs_are_retried_on_reconcile() -> None:
    """A failed consumed write-back is retried on the next reconcile."""
    broker, store, _ = broker_for(bound_pod("a", whole(0)))
    store.fail_writes = True
    broker.allocate(GPU, [uuid(0)])
    assert broker.counters.write_failures == 1 and consumed(store, "a") is None
    store.fail_writes = False
    broker.reconcile()
    assert consumed(store, "a").containers == ("main",)


def test_an_unreadable_pod_list_refuses_allocate_but_not_preferred() -> None:
    """When the pods cannot be read, Allocate is refused while a preference is still given."""

    class Broken(InMemoryPodRecords):
        def list_bound_pods_on_node(self):
            raise RecordStoreError("apiserver down")

    broker = AllocationBroker(inventory(), Broken())
    assert broker.preferred(GPU, [uuid(1), uuid(0)], [], 1) == (uuid(0),)
    with pytest.raises(AllocationRefused, match="apiserver down"):
        broker.allocate(GPU, [uuid(0)])


def test_concurrent_requests_never_over_allocate_and_consume_each_record_once() -> None:
    # 12 pods want GPU 2 or 3 whole (6 records each), 8 pods want 30-unit shares of GPU 0 or 1:
    # at most 2 whole and 6 shares (3 per GPU by units) may be served.
    """Concurrent requests never hand out a GPU beyond its capacity and consume each record once."""
    pods = [bound_pod(f"w{i}", whole(2 + i % 2), bound_at=i) for i in range(12)]
    pods += [bound_pod(f"s{i}", share(i % 2, 20000, 30), bound_at=100 + i) for i in range(8)]
    broker, store, _ = broker_for(*pods)
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

    threads = [threading.Thread(target=ask, args=(GPU, [uuid(i % 4)])) for i in range(12)]
    threads += [
        threading.Thread(target=ask, args=(SHARED, [share_unit_id(uuid(0), k) for k in range(30)]))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    whole_given = Counter(v for r, v in results if r == GPU and v != "refused")
    shares_given = Counter(v for r, v in results if r == SHARED and v != "refused")
    assert whole_given == {uuid(2): 1, uuid(3): 1}
    assert shares_given == {uuid(0): 3, uuid(1): 3}  # 3 x 30 units fit, 4 x 20000 MiB would too
    keys = [h.slot.key for h in broker.state.handouts]
    assert len(keys) == len(set(keys)) == 8
    assert sum(1 for p in store.list_bound_pods_on_node() if CONSUMED_ANNOTATION in p.annotations) == 8


def test_app_containers_get_the_pods_gpus_the_kubelet_hands_them_from_the_init_container() -> None:
    """App containers get the GPUs the kubelet hands on from the init container, or the one left."""
    containers = (
        init("init", GPU, 2),
        app("a", GPU, 1),
        app("b", GPU, 1),
    )
    broker, _, _ = broker_for(bound_pod("multi", whole(2, 3), containers))
    broker.allocate(GPU, [uuid(2), uuid(3)])
    assert visible(broker.allocate(GPU, [uuid(3)])) == [uuid(3)]  # a: the kubelet's pick
    assert visible(broker.allocate(GPU, [uuid(0)])) == [uuid(2)]  # b: a stray ID, the one left
    assert broker.counters.id_mismatches == 1


def test_two_app_containers_never_get_the_same_gpu_of_their_pod() -> None:
    """Two app containers of one pod never get the same GPU, whatever the kubelet passes."""
    containers = (
        app("a", GPU, 1),
        app("b", GPU, 1),
    )
    broker, _, _ = broker_for(bound_pod("pair", whole(0, 1), containers))
    assert visible(broker.allocate(GPU, [uuid(1)])) == [uuid(1)]
    assert visible(broker.allocate(GPU, [uuid(1)])) == [uuid(0)]


def test_a_sidecar_and_an_app_container_need_a_gpu_each() -> None:
    """A 1-GPU sidecar beside a 1-GPU app container makes the pod need 2 GPUs, one kept by each."""
    containers = (sidecar("proxy", GPU, 1), app("main", GPU, 1))
    records, problems = read_records([bound_pod("p", whole(0, 1), containers)], inventory())
    assert problems == ()
    assert [(s.container, s.grants) for s in records[0].slots] == [("proxy", whole(0)), ("main", whole(1))]
    broker, _, _ = broker_for(bound_pod("p", whole(0, 1), containers))
    assert visible(broker.allocate(GPU, [uuid(0)])) == [uuid(0)]
    assert visible(broker.allocate(GPU, [uuid(0)])) == [uuid(1)]  # never the sidecar's GPU


def test_a_sidecar_started_before_a_plain_init_container_adds_to_its_request() -> None:
    """A 1-GPU sidecar before a 2-GPU plain init container (apps asking for none) needs 3 GPUs."""
    containers = (
        sidecar("proxy", GPU, 1),
        init("warm", GPU, 2),
        ContainerDemand("main", ContainerRole.APP, ()),
    )
    records, problems = read_records([bound_pod("p", whole(0, 1, 2), containers)], inventory())
    assert problems == ()
    assert [(s.container, s.grants) for s in records[0].slots] == [
        ("proxy", whole(0)),
        ("warm", whole(1, 2)),
    ]
    too_small = replace(
        bound_pod("q", whole(0, 1), containers), annotations=bound_pod("q", whole(0, 1)).annotations
    )
    _, problems = read_records([too_small], inventory())
    assert "pod requests 3" in problems[0].reason


def test_a_plain_init_container_never_gets_a_running_sidecars_gpu() -> None:
    """The init container that runs beside a sidecar gets the record's other GPUs, whatever the kubelet passes."""
    containers = (sidecar("proxy", GPU, 1), init("warm", GPU, 2))
    broker, store, _ = broker_for(bound_pod("p", whole(0, 1, 2), containers))
    assert visible(broker.allocate(GPU, [uuid(0)])) == [uuid(0)]
    assert visible(broker.allocate(GPU, [uuid(0), uuid(1)])) == [uuid(1), uuid(2)]
    assert broker.counters.id_mismatches == 1
    assert consumed(store, "p").containers == ("proxy", "warm")


def test_a_sidecar_keeps_its_gpu_while_a_plain_init_containers_gpu_is_handed_on() -> None:
    """The app container after a sidecar and an init container reuses the init container's GPU, not the sidecar's."""
    containers = (sidecar("proxy", GPU, 1), init("warm", GPU, 1), app("main", GPU, 1))
    broker, _, _ = broker_for(bound_pod("p", whole(0, 1), containers))
    assert visible(broker.allocate(GPU, [uuid(0)])) == [uuid(0)]
    assert visible(broker.allocate(GPU, [uuid(1)])) == [uuid(1)]
    assert visible(broker.allocate(GPU, [uuid(1)])) == [uuid(1)]
    assert broker.counters.id_mismatches == 0


def test_resource_names_come_from_the_inventory() -> None:
    """A cluster that renames the whole-GPU resource is served under that name and no other."""
    names = ResourceNames(whole="example.com/gpu")
    store = InMemoryPodRecords([bound_pod("p", whole(1), (app("main", "example.com/gpu", 1),))])
    broker = AllocationBroker(inventory(names=names), store)
    assert broker.inventory.resources[:2] == ("example.com/gpu", SHARED)
    assert visible(broker.allocate("example.com/gpu", [uuid(1)])) == [uuid(1)]
    with pytest.raises(AllocationRefused):
        broker.allocate(GPU, [uuid(2)])
