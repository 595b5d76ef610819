"""What the device plugin needs from the cluster, as a Protocol, plus an in-memory fake.

The Kubernetes adapter implements `PodLedger`; the device plugin never talks to the API itself.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from topology.allocation import (
    ALLOCATION_ANNOTATION,
    CONSUMED_ANNOTATION,
    Allocation,
    AllocationError,
    Consumption,
    decode_allocation,
    encode_allocation,
    encode_consumption,
)


@dataclass(frozen=True, slots=True)
class PodRef:
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class ContainerDemand:
    """One container's extended-resource requests (limits), e.g. (("nvidia.com/gpu", 2),).

    `init` is True for init containers that run to completion before the app containers; the
    kubelet hands their devices on to later containers. Sidecars (restartable init containers)
    keep their devices for the pod's life and count as app containers here (`init=False`).
    """

    name: str
    resources: tuple[tuple[str, int], ...]
    init: bool = False

    def amount(self, resource: str) -> int:
        return sum(n for r, n in self.resources if r == resource)


@dataclass(frozen=True)
class BoundPod:
    """A pod bound to this node that has not terminated.

    `containers`: init containers first, then app containers, each in spec order (the order in
    which the kubelet admits them). `bound_at`: when it was bound (the PodScheduled condition's
    transition time, else the creation time), in seconds since the epoch.
    """

    ref: PodRef
    bound_at: float
    containers: tuple[ContainerDemand, ...]
    annotations: Mapping[str, str] = field(default_factory=dict)


class LedgerError(RuntimeError):
    """The cluster could not be read or written; the message says what failed."""


class PodLedger(Protocol):
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


class InMemoryPodLedger:
    """A PodLedger over a dict, for tests and demos. Thread-safe; records every write."""

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
                raise LedgerError(f"{what} {pod}: injected failure")
            stored = self._pods.get(pod.uid)
            if stored is None or _record_generation(stored) != generation:
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


def _record_generation(pod: BoundPod) -> int | None:
    text = pod.annotations.get(ALLOCATION_ANNOTATION)
    if text is None:
        return None
    try:
        return decode_allocation(text).generation
    except AllocationError:
        return None
