"""KubePodRecords: the device plugin's record store over NodeApi, against an in-memory API."""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import replace
from types import MappingProxyType

import pytest

from contract.allocation import (
    Allocation,
    Consumption,
    decode_allocation,
    decode_consumption,
    encode_allocation,
    encode_consumption,
)
from contract.keys import ALLOCATION_ANNOTATION, CONSUMED_ANNOTATION
from contract.pod_demand import ContainerDemand, ContainerRole
from contract.pods import PodRef
from node_agent.deviceplugin.broker import AllocationBroker
from node_agent.deviceplugin.pod_records import KubePodRecords, bound_pod
from node_agent.deviceplugin.record_store import RecordStoreError, record_generation
from node_agent.kube.node_api import PodInfo, pod_from_dict
from tests.node_agent.fakes import FakeNodeApi
from tests.support.device_plugin import app, init, inventory, sidecar, uuid, whole
from tests.support.pods import pod_info
from tests.support.resources import GPU, NAMES

NODE = "node-a"
T0 = dt.datetime(2024, 5, 1, 10, 0, 0, tzinfo=dt.UTC)


def _record(*indices: int, generation: int = 1) -> str:
    return encode_allocation(
        Allocation(NODE, whole(*indices), generation=generation, resources=((GPU, len(indices)),))
    )


def _pod(
    name: str,
    gpus: int = 1,
    *,
    record: str | None = None,
    phase: str = "Running",
    node: str = NODE,
    init: tuple[ContainerDemand, ...] = (),
    scheduled_at: dt.datetime | None = T0,
    created: dt.datetime | None = T0 - dt.timedelta(seconds=5),
    rv: str = "10",
) -> PodInfo:
    """A pod on the node asking for `gpus` whole GPUs in its one app container, after `init`."""
    return pod_info(
        name,
        node=node,
        phase=phase,
        resource_version=rv,
        record=record,
        demands=(*init, app("main", GPU, gpus)),
        created=created,
        scheduled_at=scheduled_at,
    )


def _ref(name: str) -> PodRef:
    return PodRef("ml", name, f"uid-{name}")


def _cluster(*pods: PodInfo) -> FakeNodeApi:
    cluster = FakeNodeApi(NODE)
    cluster.pods = list(pods)
    return cluster


def _stored(cluster: FakeNodeApi, name: str) -> PodInfo:
    pod = cluster.get_pod("ml", name)
    assert pod is not None
    return pod


CONSUMED = Consumption(1, ("main",), (uuid(0),))


# ---------------------------------------------------------------------- translation


def test_pod_translation_reads_init_containers_sidecars_and_the_scheduled_time() -> None:
    """A pod's init containers, sidecars and app containers come in admission order with their roles."""
    pod = pod_from_dict(
        {
            "metadata": {
                "name": "p",
                "namespace": "ml",
                "uid": "u",
                "creationTimestamp": "2024-05-01T09:59:00Z",
            },
            "spec": {
                "nodeName": NODE,
                "initContainers": [
                    {"name": "warm", "resources": {"limits": {GPU: "2"}}},
                    {"name": "proxy", "restartPolicy": "Always", "resources": {"limits": {GPU: "1"}}},
                ],
                "containers": [{"name": "main", "resources": {"limits": {GPU: "1", "cpu": "500m"}}}],
            },
            "status": {
                "phase": "Pending",
                "conditions": [
                    {"type": "Initialized", "status": "True", "lastTransitionTime": "2024-05-01T10:00:09Z"},
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2024-05-01T10:00:00Z"},
                ],
            },
        },
        NAMES.managed,
    )
    assert pod.demands == (init("warm", GPU, 2), sidecar("proxy", GPU, 1), app("main", GPU, 1))
    assert pod.scheduled_at == T0 and pod.bound_at == T0 and pod.spec_problem == ""
    unscheduled = pod_from_dict(
        {"metadata": {"creationTimestamp": "2024-05-01T10:00:00Z"}, "status": {}}, NAMES.managed
    )
    assert unscheduled.scheduled_at is None and unscheduled.bound_at == T0 and unscheduled.demands == ()


def test_bound_pod_keeps_the_containers_in_admission_order_with_their_roles() -> None:
    """The device plugin sees init containers first (plain and sidecar), then app containers, with their roles."""
    demands = (init("warm", GPU, 2), sidecar("proxy", GPU, 1))
    bound = bound_pod(_pod("p", init=demands, record=_record(0)))
    assert [(c.name, c.role) for c in bound.containers] == [
        ("warm", ContainerRole.INIT),
        ("proxy", ContainerRole.SIDECAR),
        ("main", ContainerRole.APP),
    ]
    assert bound.ref == _ref("p") and bound.bound_at == T0.timestamp()
    assert bound.annotations[ALLOCATION_ANNOTATION] == _record(0)


def test_a_pod_with_an_unreadable_quantity_asks_for_nothing_and_is_logged_once(caplog) -> None:
    """A pod whose GPU quantity is not a whole number is served nothing, logged once, and never crashes the store."""
    obj = {
        "metadata": {"name": "odd", "namespace": "ml", "uid": "uid-odd"},
        "spec": {"nodeName": NODE, "containers": [{"name": "main", "resources": {"limits": {GPU: "0.5"}}}]},
        "status": {"phase": "Running"},
    }
    pod = pod_from_dict(obj, NAMES.managed)
    assert pod.demands == () and "main" in pod.spec_problem and GPU in pod.spec_problem
    ignored = pod_from_dict(
        {**obj, "spec": {"containers": [{"resources": {"limits": {"x.io/y": "0.5"}}}]}}, NAMES.managed
    )
    assert ignored.spec_problem == ""  # only the resources we serve are read
    store = KubePodRecords(
        _cluster(replace(pod, annotations=MappingProxyType({ALLOCATION_ANNOTATION: _record(0)}))), NODE
    )
    with caplog.at_level(logging.WARNING, logger="node_agent.deviceplugin.pod_records"):
        (bound,) = store.list_bound_pods_on_node()
        store.list_bound_pods_on_node()
    assert bound.containers == ()
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
    broker = AllocationBroker(inventory(), store)
    broker.resync()
    assert broker.state.handouts == ()


def test_bound_at_falls_back_to_the_creation_time_then_zero() -> None:
    """The bind time falls back to the creation time, then to zero, and naive times are read as UTC."""
    assert bound_pod(_pod("p", scheduled_at=None)).bound_at == (T0 - dt.timedelta(seconds=5)).timestamp()
    assert bound_pod(_pod("p", scheduled_at=None, created=None)).bound_at == 0.0
    naive = dt.datetime(2024, 5, 1, 10, 0, 0)
    assert bound_pod(_pod("p", scheduled_at=naive)).bound_at == T0.timestamp()  # read as UTC


def test_record_generation_of_missing_and_unreadable_records() -> None:
    """A missing or unreadable record has no generation."""
    assert record_generation({ALLOCATION_ANNOTATION: _record(0, generation=3)}) == 3
    assert record_generation({}) is None
    assert record_generation({ALLOCATION_ANNOTATION: "{not json"}) is None


# ---------------------------------------------------------------------- listing


def test_listing_skips_finished_pods_and_pods_of_other_nodes() -> None:
    """The listing leaves out finished pods and pods of other nodes."""
    cluster = _cluster(
        _pod("running", record=_record(0)),
        _pod("pending", phase="Pending"),
        _pod("done", phase="Succeeded"),
        _pod("failed", phase="Failed"),
        _pod("elsewhere", node="node-b"),
    )
    pods = KubePodRecords(cluster, NODE).list_bound_pods_on_node()
    assert [p.ref.name for p in pods] == ["running", "pending"]


def test_a_failed_listing_is_a_record_store_error() -> None:
    """A listing the API refuses is a RecordStoreError naming the node."""
    cluster = _cluster(_pod("p"))
    cluster.fail_next = True
    with pytest.raises(RecordStoreError, match=r"cannot list the pods of node node-a.*HTTP 500"):
        KubePodRecords(cluster, NODE).list_bound_pods_on_node()


# ---------------------------------------------------------------------- writing


def test_mark_consumed_patches_once_with_the_listed_resource_version() -> None:
    """Marking consumed costs one patch at the resourceVersion of the listing."""
    cluster = _cluster(_pod("p", record=_record(0), rv="41"))
    store = KubePodRecords(cluster, NODE)
    store.list_bound_pods_on_node()
    assert store.mark_consumed(_ref("p"), CONSUMED) is True
    assert [(p[1], p[3]) for p in cluster.pod_patches] == [("p", "41")]
    assert cluster.pod_reads == 0
    stored = _stored(cluster, "p")
    assert decode_consumption(stored.annotations[CONSUMED_ANNOTATION]) == CONSUMED
    assert stored.annotations[ALLOCATION_ANNOTATION] == _record(0)


def test_mark_consumed_without_a_listing_reads_the_pod_first() -> None:
    """Without a listing, the pod is read before it is patched."""
    cluster = _cluster(_pod("p", record=_record(0)))
    assert KubePodRecords(cluster, NODE).mark_consumed(_ref("p"), CONSUMED) is True
    assert cluster.pod_reads == 1 and len(cluster.pod_patches) == 1


def test_a_conflict_is_read_again_and_retried() -> None:
    """A conflict makes the store read the pod again and retry."""
    cluster = _cluster(_pod("p", record=_record(0)))
    store = KubePodRecords(cluster, NODE)
    store.list_bound_pods_on_node()
    cluster.replace_pod(_stored(cluster, "p"), phase="Running")  # someone else wrote: rv moved on
    assert store.mark_consumed(_ref("p"), CONSUMED) is True
    assert [p[3] for p in cluster.pod_patches] == ["10", "11"]
    assert CONSUMED_ANNOTATION in _stored(cluster, "p").annotations


def test_a_record_rewritten_meanwhile_is_not_marked() -> None:
    """A record rewritten to a new generation meanwhile is not marked consumed."""
    cluster = _cluster(_pod("p", record=_record(0)))
    store = KubePodRecords(cluster, NODE)
    store.list_bound_pods_on_node()

    def rewrite() -> None:
        cluster.before_pod_patch = None
        pod = _stored(cluster, "p")
        cluster.replace_pod(
            pod, annotations=MappingProxyType({ALLOCATION_ANNOTATION: _record(1, generation=2)})
        )

    cluster.before_pod_patch = rewrite
    assert store.mark_consumed(_ref("p"), CONSUMED) is False
    assert len(cluster.pod_patches) == 1  # the re-read saw generation 2 and stopped
    assert CONSUMED_ANNOTATION not in _stored(cluster, "p").annotations


def test_wrong_generation_missing_pod_and_recreated_pod_are_moot() -> None:
    """A wrong generation, a missing pod or a pod recreated under the same name make the write moot."""
    cluster = _cluster(_pod("p", record=_record(0, generation=2)), _pod("no-record"))
    store = KubePodRecords(cluster, NODE)
    store.list_bound_pods_on_node()
    assert store.mark_consumed(_ref("p"), CONSUMED) is False  # generation 2 != 1
    assert store.mark_consumed(_ref("no-record"), CONSUMED) is False
    assert store.mark_consumed(_ref("gone"), CONSUMED) is False
    assert cluster.pod_patches == []
    twin = _pod("twin", record=_record(0))
    cluster.pods.append(twin)
    store.list_bound_pods_on_node()
    cluster.pods = [replace(twin, uid="uid-new", resource_version="99")]
    assert store.mark_consumed(_ref("twin"), CONSUMED) is False  # conflict, re-read: another pod
    assert CONSUMED_ANNOTATION not in cluster.pods[0].annotations


def test_answers_without_a_write_are_checked_against_a_fresh_read() -> None:
    """An answer given without writing is always confirmed by a fresh read."""
    cluster = _cluster(_pod("p", record=_record(0)))
    store = KubePodRecords(cluster, NODE)
    store.list_bound_pods_on_node()
    assert store.mark_consumed(_ref("p"), CONSUMED) is True
    # the remembered copy says "already consumed", but the record was rewritten since
    stored = _stored(cluster, "p")
    rewritten = {**stored.annotations, ALLOCATION_ANNOTATION: _record(1, generation=2)}
    cluster.replace_pod(stored, annotations=MappingProxyType(rewritten))
    reads = cluster.pod_reads
    assert store.mark_consumed(_ref("p"), CONSUMED) is False
    assert cluster.pod_reads == reads + 1 and len(cluster.pod_patches) == 1
    # the remembered copy has generation 2, the API is back at 1: the API is what counts
    stored = _stored(cluster, "p")
    cluster.replace_pod(stored, annotations=MappingProxyType({ALLOCATION_ANNOTATION: _record(0)}))
    assert store.mark_consumed(_ref("p"), CONSUMED) is True and len(cluster.pod_patches) == 2


def test_a_pod_deleted_before_the_patch_is_moot() -> None:
    """A pod deleted before the patch makes the write moot."""
    cluster = _cluster(_pod("p", record=_record(0)))
    store = KubePodRecords(cluster, NODE)
    store.list_bound_pods_on_node()
    cluster.pods = []
    assert store.mark_consumed(_ref("p"), CONSUMED) is False


def test_an_already_written_consumption_is_not_written_again() -> None:
    """A consumption already on the pod is not written again."""
    annotations = {ALLOCATION_ANNOTATION: _record(0), CONSUMED_ANNOTATION: encode_consumption(CONSUMED)}
    pod = replace(_pod("p"), annotations=MappingProxyType(annotations))
    cluster = _cluster(pod)
    store = KubePodRecords(cluster, NODE)
    store.list_bound_pods_on_node()
    assert store.mark_consumed(_ref("p"), CONSUMED) is True and cluster.pod_patches == []


def test_endless_conflicts_give_up_with_a_record_store_error() -> None:
    """Endless conflicts give up after the configured attempts with a RecordStoreError."""
    cluster = _cluster(_pod("p", record=_record(0)))
    store = KubePodRecords(cluster, NODE, write_attempts=3)
    store.list_bound_pods_on_node()

    def touch() -> None:
        cluster.replace_pod(_stored(cluster, "p"))

    cluster.before_pod_patch = touch
    with pytest.raises(RecordStoreError, match=r"kept changing \(3 conflicting attempts\)"):
        store.mark_consumed(_ref("p"), CONSUMED)
    assert len(cluster.pod_patches) == 3


def test_api_failures_are_record_store_errors() -> None:
    """API failures while reading or patching are RecordStoreErrors."""
    cluster = _cluster(_pod("p", record=_record(0)))
    store = KubePodRecords(cluster, NODE)
    cluster.fail_next = True  # the read
    with pytest.raises(RecordStoreError, match="mark consumed ml/p: get pod: HTTP 500"):
        store.mark_consumed(_ref("p"), CONSUMED)
    store.list_bound_pods_on_node()
    cluster.fail_next = True  # the patch
    with pytest.raises(RecordStoreError, match="patch pod: HTTP 500"):
        store.mark_consumed(_ref("p"), CONSUMED)
    with pytest.raises(ValueError):
        KubePodRecords(cluster, NODE, write_attempts=0)


def test_rewrite_allocation_replaces_the_record_and_the_consumption_in_one_patch() -> None:
    """Rewriting a record replaces it and its consumption in one patch, and replays are idempotent."""
    annotations = {ALLOCATION_ANNOTATION: _record(0), CONSUMED_ANNOTATION: encode_consumption(CONSUMED)}
    cluster = _cluster(replace(_pod("p"), annotations=MappingProxyType(annotations)))
    store = KubePodRecords(cluster, NODE)
    store.list_bound_pods_on_node()
    new = Allocation(NODE, whole(1), generation=2, resources=((GPU, 1),))
    assert store.rewrite_allocation(_ref("p"), 1, new, None) is True
    stored = _stored(cluster, "p")
    assert decode_allocation(stored.annotations[ALLOCATION_ANNOTATION]) == new
    assert CONSUMED_ANNOTATION not in stored.annotations and len(cluster.pod_patches) == 1
    # replaying the same rewrite (its answer was lost) succeeds without writing
    assert store.rewrite_allocation(_ref("p"), 1, new, None) is True and len(cluster.pod_patches) == 1
    # another rewrite over generation 1 is moot now
    other = Allocation(NODE, whole(2), generation=2, resources=((GPU, 1),))
    assert store.rewrite_allocation(_ref("p"), 1, other, Consumption(2, ("main",), (uuid(2),))) is False


def test_the_broker_hands_out_and_writes_back_through_kube_pod_records() -> None:
    """The broker hands out and writes back through KubePodRecords."""
    cluster = _cluster(_pod("train", 2, record=_record(2, 3)), _pod("plain"))
    broker = AllocationBroker(inventory(4), KubePodRecords(cluster, NODE))
    broker.resync()
    spec = broker.allocate(GPU, [uuid(0), uuid(1)])
    assert spec.env("NVIDIA_VISIBLE_DEVICES") == f"{uuid(2)},{uuid(3)}"
    consumed = decode_consumption(_stored(cluster, "train").annotations[CONSUMED_ANNOTATION])
    assert consumed.generation == 1 and consumed.containers == ("main",)
    assert broker.counters.allocations == 1 and broker.counters.id_mismatches == 1
    cluster.fail_next = True
    with pytest.raises(RecordStoreError):
        broker.reconcile()
