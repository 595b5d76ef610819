"""Where the device plugin reads and writes allocation records: the pods bound to this node.

The extender writes a pod's record (`linkpack.io/allocation`) with its Binding; the plugin reads
the records back from the pods, and writes `linkpack.io/consumed` (and, after a swap, rewritten
records) onto them. `PodRecordStore` is that access as a Protocol; `pod_records.KubePodRecords`
implements it over the API and `InMemoryPodRecords` over a dict. The plugin never talks to the
API itself. (This is not the extender's per-node ledger ConfigMap, `contract.ledger`.)
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from contract.allocation import (
    Allocation,
    AllocationError,
    Consumption,
    decode_allocation,
    encode_allocation,
    encode_consumption,
)
from contract.keys import ALLOCATION_ANNOTATION, CONSUMED_ANNOTATION
from contract.pod_demand import ContainerDemand
from contract.pods import PodRef


@dataclass(frozen=True)
class BoundPod:
    """A pod bound to this node that has not terminated.

    `containers`: what each container asks for (`contract.pod_demand.container_demands`: init
    containers, plain and sidecar, then app containers, in the order the kubelet admits them).
    `bound_at`: when it was bound (the PodScheduled condition's transition time, else the
    creation time), in seconds since the epoch.
    """

    ref: PodRef
    bound_at: float
    containers: tuple[ContainerDemand, ...]
    annotations: Mapping[str, str] = field(default_factory=dict)


class RecordStoreError(RuntimeError):
    """The pods could not be read or written; the message says what failed."""


class PodRecordStore(Protocol):
    """The pods of this node and their Linkpack annotations."""

    def list_bound_pods_on_node(self) -> Sequence[BoundPod]:
        """Every non-terminated pod bound to this node, read fresh (not from a stale cache)."""
        ...

    def mark_consumed(self, pod: PodRef, consumption: Consumption) -> bool:
        """Set `linkpack.io/consumed` on the pod, but only while its `linkpack.io/allocation` still
        has generation `consumption.generation` (patch with a resourceVersion precondition, re-read
        and retry on conflict). False when the pod is gone or its record was rewritten meanwhile."""
        ...

    def rewrite_allocation(
        self, pod: PodRef, replaces_generation: int, allocation: Allocation, consumption: Consumption | None
    ) -> bool:
        """Replace the pod's allocation record (and consumed annotation; None removes it) in one
        patch, only while the current record has generation `replaces_generation`. Used when the
        kubelet's own account shows a container got another pod's record. False as for mark_consumed."""
        ...


class InMemoryPodRecords:
    """A PodRecordStore over a dict, for tests and demos. Thread-safe; records every write."""

    def __init__(self, pods: Sequence[BoundPod] = ()) -> None:
        self._lock = threading.Lock()
        self._pods: dict[str, BoundPod] = {p.ref.uid: p for p in pods}
        self.writes: list[tuple[str, PodRef, dict[str, str | None]]] = []
        self.fail_writes = False
        self.list_calls = 0

    def put(self, pod: BoundPod) -> None:
        with self._lock:
            self._pods[pod.ref.uid] = pod

    def remove(self, uid: str) -> None:
        with self._lock:
            self._pods.pop(uid, None)

    def pod(self, uid: str) -> BoundPod:
        with self._lock:
            return self._pods[uid]

    def list_bound_pods_on_node(self) -> Sequence[BoundPod]:
        with self._lock:
            self.list_calls += 1
            return tuple(self._pods.values())

    def mark_consumed(self, pod: PodRef, consumption: Consumption) -> bool:
        return self._patch(
            "mark_consumed",
            pod,
            consumption.generation,
            {CONSUMED_ANNOTATION: encode_consumption(consumption)},
        )

    def rewrite_allocation(
        self, pod: PodRef, replaces_generation: int, allocation: Allocation, consumption: Consumption | None
    ) -> bool:
        changes: dict[str, str | None] = {
            ALLOCATION_ANNOTATION: encode_allocation(allocation),
            CONSUMED_ANNOTATION: encode_consumption(consumption) if consumption else None,
        }
        return self._patch("rewrite_allocation", pod, replaces_generation, changes)

    def _patch(self, what: str, pod: PodRef, generation: int, changes: dict[str, str | None]) -> bool:
        with self._lock:
            if self.fail_writes:
                raise RecordStoreError(f"{what} {pod}: injected failure")
            stored = self._pods.get(pod.uid)
            if stored is None or record_generation(stored.annotations) != generation:
                return False
            annotations = dict(stored.annotations)
            for key, value in changes.items():
                if value is None:
                    annotations.pop(key, None)
                else:
                    annotations[key] = value
            self._pods[pod.uid] = replace(stored, annotations=annotations)
            self.writes.append((what, pod, changes))
            return True


def record_generation(annotations: Mapping[str, str]) -> int | None:
    """The generation of the pod's allocation record; None when it has none or it is unreadable."""
    text = annotations.get(ALLOCATION_ANNOTATION)
    if text is None:
        return None
    try:
        return decode_allocation(text).generation
    except AllocationError:
        return None
