"""The node's side of the hand-off (`node_agent.deviceplugin.holds`, the broker with the kubelet's
pod-resources account): departed pods release as soon as the kubelet no longer holds them, a
request no record fits is retried after such a release, what the node holds is reported from
the kubelet's account, and draining stops taking new pods."""

from __future__ import annotations

import pytest

from contract.handoff import HeldPod, NodeHolds
from node_agent.deviceplugin.broker import AllocationBroker, AllocationRefused
from node_agent.deviceplugin.holds import grants_of_devices, kubelet_active, node_holds, report_holds
from node_agent.deviceplugin.inventory import share_unit_id
from node_agent.deviceplugin.reconcile import KubeletAssignment
from node_agent.deviceplugin.record_store import InMemoryPodRecords
from node_agent.deviceplugin.request_matching import HandoutState, release_departed
from tests.support.device_plugin import bound_pod, inventory, share, uuid, whole
from tests.support.resources import GPU, SHARED
from topology.scheduling import GpuGrant

from .test_request_matching import Clock, visible


class Kubelet:
    """What the kubelet's pod-resources List answers, set by the test."""

    def __init__(self) -> None:
        self.assignments: list[KubeletAssignment] = []
        self.down = False

    def hold(self, name: str, resource: str, *ids: str) -> None:
        self.assignments.append(KubeletAssignment("default", name, "main", resource, tuple(ids)))

    def forget(self, name: str) -> None:
        self.assignments = [a for a in self.assignments if a.pod != name]

    def __call__(self) -> list[KubeletAssignment]:
        if self.down:
            raise OSError("pod-resources List failed: UNAVAILABLE")
        return list(self.assignments)


class RevisionedStore(InMemoryPodRecords):
    def __init__(self, pods=()) -> None:
        super().__init__(pods)
        self.revision = 10

    def listing_revision(self) -> str:
        return str(self.revision)


def broker_with_kubelet(*pods, gpus: int = 4):
    store = RevisionedStore(pods)
    kubelet = Kubelet()
    clock = Clock()
    broker = AllocationBroker(
        inventory(gpus), store, clock=clock, kubelet_account=kubelet, holds_refresh_s=5.0
    )
    return broker, store, kubelet, clock


def test_a_deleted_pod_the_kubelet_no_longer_holds_frees_its_gpu_at_once() -> None:
    """No grace period: once the pod is gone from the API and from the kubelet's account, a new
    pod recorded on the same GPU is admitted right away."""
    broker, store, kubelet, _ = broker_with_kubelet(bound_pod("a", whole(0)))
    broker.allocate(GPU, [uuid(0)])
    kubelet.hold("a", GPU, uuid(0))
    store.remove("uid-a")
    store.put(bound_pod("b", whole(0), bound_at=50))
    broker.reconcile()  # the kubelet still holds a (terminating): nothing is released
    with pytest.raises(AllocationRefused):
        broker.allocate(GPU, [uuid(0)])
    kubelet.forget("a")
    assert visible(broker.allocate(GPU, [uuid(0)])) == [uuid(0)]  # refreshed before refusing


def test_a_pod_deleted_with_force_keeps_its_gpu_while_the_kubelet_still_lists_it() -> None:
    """`kubectl delete --force` removes the pod from the API while its containers still run: the
    hold stays as long as the kubelet accounts the device to it."""
    broker, store, kubelet, clock = broker_with_kubelet(bound_pod("a", whole(1)))
    broker.allocate(GPU, [uuid(1)])
    kubelet.hold("a", GPU, uuid(1))
    store.remove("uid-a")
    clock.now += 3600
    broker.reconcile()
    assert [h.holder.name for h in broker.state.claims] == ["a"]
    kubelet.forget("a")
    broker.reconcile()
    assert broker.state.claims == ()


def test_release_departed_without_the_kubelet_keeps_the_grace_period() -> None:
    """With no pod-resources account the old rule applies: missing for the grace period."""
    broker, _store, _, clock = broker_with_kubelet(bound_pod("a", whole(0)))
    broker.allocate(GPU, [uuid(0)])
    state = broker.state
    assert release_departed(state, [], clock.now + 10, 60.0).claims == state.claims
    assert release_departed(state, [], clock.now + 61, 60.0).claims == ()
    assert release_departed(state, [], clock.now + 10, 60.0, kubelet_active=[]).claims == ()
    kept = release_departed(state, [], clock.now + 999, 60.0, kubelet_active=[("default", "a")])
    assert kept.claims == state.claims


def test_the_preferred_devices_are_the_records_once_a_departed_pod_is_released() -> None:
    """GetPreferredAllocation refreshes too, so the kubelet is steered to the record's GPU and
    its account (pod-resources) names what the container gets."""
    broker, store, _kubelet, _ = broker_with_kubelet(bound_pod("a", whole(2)))
    broker.allocate(GPU, [uuid(2)])
    store.remove("uid-a")
    store.put(bound_pod("b", whole(2), bound_at=50))
    available = [uuid(3), uuid(2), uuid(0)]
    assert broker.preferred(GPU, available, [], 1) == (uuid(2),)


def test_node_holds_names_record_grants_or_what_the_kubelets_ids_stand_for() -> None:
    """A pod with a hold reports its record's grants (share memory included); a pod known only
    to the kubelet reports the GPUs its device IDs name; the list revision is carried."""
    broker, _store, kubelet, _ = broker_with_kubelet(bound_pod("s", share(1, 8000, 25)))
    broker.allocate(SHARED, [share_unit_id(uuid(1), k) for k in range(25)])
    kubelet.hold("s", SHARED, *(share_unit_id(uuid(1), k) for k in range(25)))
    kubelet.hold("ghost", GPU, uuid(3))
    broker.reconcile()
    holds = broker.holds()
    assert holds is not None and holds.revision == "10" and holds.admitting
    by_name = {p.name: p for p in holds.pods}
    assert by_name["s"].uid == "uid-s" and by_name["s"].grants == share(1, 8000, 25)
    assert by_name["ghost"].uid == "" and by_name["ghost"].grants == (GpuGrant(3, uuid(3), whole=True),)


def test_grants_of_devices_counts_share_units_per_gpu() -> None:
    """Share units of one GPU become one grant with their units and memory."""
    inv = inventory(2)
    ids = [share_unit_id(uuid(0), k) for k in range(10)] + [uuid(1)]
    grants = grants_of_devices(ids, inv)
    assert [(g.uuid, g.whole, g.units) for g in grants] == [(uuid(0), False, 10), (uuid(1), True, 0)]


def test_the_report_moves_on_change_and_otherwise_only_every_refresh_interval() -> None:
    """A steady node does not rewrite its status on every look; a change goes out at once."""
    one = NodeHolds("5", (HeldPod("default", "a", "u", ()),))
    assert report_holds(None, 0.0, one, 10.0, 5.0) == (one, 10.0)
    later = NodeHolds("9", one.pods)
    assert report_holds(one, 10.0, later, 12.0, 5.0) == (one, 10.0)
    assert report_holds(one, 10.0, later, 15.0, 5.0) == (later, 15.0)
    changed = NodeHolds("9", ())
    assert report_holds(one, 10.0, changed, 11.0, 5.0) == (changed, 11.0)


def test_an_unreachable_kubelet_or_a_drain_stops_taking_new_pods() -> None:
    """While pod-resources cannot be asked, or once draining began, the report says not admitting."""
    broker, _, kubelet, _ = broker_with_kubelet(bound_pod("a", whole(0)))
    broker.reconcile()
    holds = broker.holds()
    assert holds is not None and holds.admitting
    kubelet.down = True
    broker.reconcile()
    down = broker.holds()
    assert down is not None and not down.admitting
    kubelet.down = False
    broker.reconcile()
    assert (broker.holds() or NodeHolds("")).admitting
    broker.begin_drain()
    drained = broker.holds()
    assert drained is not None and not drained.admitting
    assert kubelet_active(kubelet()) == frozenset()


def test_node_holds_prefers_the_api_uid_of_the_pod() -> None:
    """The uid comes from the API listing when the pod is there."""
    inv = inventory(1)
    a = KubeletAssignment("ns", "p", "c", GPU, (uuid(0),))
    holds = node_holds("7", [a], HandoutState(), {("ns", "p"): "uid-p"}, inv)
    assert holds.pods == (HeldPod("ns", "p", "uid-p", (GpuGrant(0, uuid(0), whole=True),)),)


@pytest.mark.timeout(30)
def test_a_kubelet_that_lost_an_answered_allocate_gets_the_same_gpu_again() -> None:
    """The kubelet stopped after our answer and before it recorded it: after its restart it
    admits the pod again and asks once more. It accounts no device to that pod, so the record's
    slot is handed out again (same GPU, same pod) instead of refused."""
    broker, _store, _kubelet, _ = broker_with_kubelet(bound_pod("a", whole(1)))
    assert visible(broker.allocate(GPU, [uuid(1)])) == [uuid(1)]
    assert visible(broker.allocate(GPU, [uuid(1)])) == [uuid(1)]  # asked again
    assert len(broker.state.handouts) == 1
    assert [h.holder.name for h in broker.state.claims] == ["a"]


@pytest.mark.timeout(30)
def test_a_container_the_kubelet_still_accounts_is_not_served_other_ids() -> None:
    """When the kubelet's account names the pod's devices, a second request of the same size
    for other IDs is not that pod's: it is refused rather than given the pod's GPU again."""
    broker, _store, kubelet, _ = broker_with_kubelet(bound_pod("a", whole(1)))
    broker.allocate(GPU, [uuid(1)])
    kubelet.hold("a", GPU, uuid(1))
    with pytest.raises(AllocationRefused):
        broker.allocate(GPU, [uuid(2)])


@pytest.mark.timeout(30)
def test_without_the_kubelets_account_an_answered_allocate_is_not_repeated() -> None:
    """With the pod-resources socket down nothing says the kubelet lost the answer: refuse."""
    broker, _store, kubelet, _ = broker_with_kubelet(bound_pod("a", whole(1)))
    broker.allocate(GPU, [uuid(1)])
    kubelet.down = True
    with pytest.raises(AllocationRefused):
        broker.allocate(GPU, [uuid(1)])


@pytest.mark.timeout(30)
def test_a_kubelet_asking_again_for_the_very_same_ids_is_the_same_container() -> None:
    """Restored from its checkpoint, the kubelet may account the devices and still ask again:
    the very IDs of the earlier answer are that container's own, so they are served again."""
    broker, _store, kubelet, _ = broker_with_kubelet(bound_pod("a", whole(1)))
    broker.allocate(GPU, [uuid(1)])
    kubelet.hold("a", GPU, uuid(1))
    assert visible(broker.allocate(GPU, [uuid(1)])) == [uuid(1)]
