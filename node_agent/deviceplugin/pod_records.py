"""`KubePodRecords`: the device plugin's `PodRecordStore` over the Kubernetes API (`NodeApi`).

The allocation records live on the pods bound to this node. Reads are always fresh (a
field-selected list of this node's pods); writes are merge patches of the pod's annotations
with a resourceVersion precondition, so a record is only written over the very version whose
generation was checked. On a conflict the pod is read again and the generation checked again,
a bounded number of times.

The last listing is remembered per pod: the first write attempt uses its resourceVersion, so
the common case costs one PATCH. A stale remembered version only costs a conflict and a re-read.

A pod whose container resources cannot be read (`PodInfo.spec_problem`) is logged once and
asks for nothing the device plugin serves.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Mapping, Sequence

from contract.allocation import Allocation, Consumption, encode_allocation, encode_consumption
from contract.keys import ALLOCATION_ANNOTATION, CONSUMED_ANNOTATION
from contract.pods import PodRef
from node_agent.deviceplugin.record_store import BoundPod, RecordStoreError, record_generation
from node_agent.kube.node_api import KubeConflict, KubeError, KubeNotFound, NodeApi, PodInfo

log = logging.getLogger(__name__)

DEFAULT_WRITE_ATTEMPTS = 5


def bound_pod(pod: PodInfo) -> BoundPod:
    """The device plugin's view of a pod (its container demands in admission order)."""
    return BoundPod(
        ref=PodRef(pod.namespace, pod.name, pod.uid),
        bound_at=_epoch(pod.bound_at),
        containers=pod.demands,
        annotations=pod.annotations,
    )


class KubePodRecords:
    """`PodRecordStore` for the pods bound to `node`. Thread-safe."""

    def __init__(self, api: NodeApi, node: str, *, write_attempts: int = DEFAULT_WRITE_ATTEMPTS):
        if write_attempts < 1:
            raise ValueError(f"write_attempts must be positive, got {write_attempts}")
        self._api = api
        self._node = node
        self._attempts = write_attempts
        self._lock = threading.Lock()
        self._seen: dict[str, PodInfo] = {}  # by uid, from the last listing or write
        self._reported: set[tuple[str, str]] = set()  # (uid, spec problem) already logged
        self._revision: str | None = None

    def listing_revision(self) -> str | None:
        """The resourceVersion of the last listing (None when the API does not say)."""
        with self._lock:
            return self._revision

    def list_bound_pods_on_node(self) -> Sequence[BoundPod]:
        with_revision = getattr(self._api, "list_node_pods_with_revision", None)
        try:
            if callable(with_revision):
                pods, revision = with_revision(self._node)
            else:
                pods, revision = self._api.list_node_pods(self._node), None
        except KubeError as exc:
            raise RecordStoreError(f"cannot list the pods of node {self._node}: {exc}") from exc
        current = [p for p in pods if not p.finished and p.node_name in (self._node, "")]
        with self._lock:
            self._revision = revision or None
            self._seen = {p.uid: p for p in current}
            self._reported = {r for r in self._reported if r[0] in self._seen}  # forget departed pods
            for p in current:
                if p.spec_problem and (p.uid, p.spec_problem) not in self._reported:
                    self._reported.add((p.uid, p.spec_problem))
                    log.warning(
                        "pod %s/%s: %s; it is served nothing by the device plugin",
                        p.namespace,
                        p.name,
                        p.spec_problem,
                    )
        return tuple(bound_pod(p) for p in current)

    def mark_consumed(self, pod: PodRef, consumption: Consumption) -> bool:
        encoded = encode_consumption(consumption)
        return self._patch("mark consumed", pod, consumption.generation, {CONSUMED_ANNOTATION: encoded})

    def rewrite_allocation(
        self, pod: PodRef, replaces_generation: int, allocation: Allocation, consumption: Consumption | None
    ) -> bool:
        changes: dict[str, str | None] = {
            ALLOCATION_ANNOTATION: encode_allocation(allocation),
            CONSUMED_ANNOTATION: encode_consumption(consumption) if consumption is not None else None,
        }
        return self._patch("rewrite allocation of", pod, replaces_generation, changes)

    # ------------------------------------------------------------------ writing

    def _patch(self, what: str, ref: PodRef, generation: int, changes: Mapping[str, str | None]) -> bool:
        """Patch while the record has `generation`; False when the pod is gone or its record moved on.

        Only the patch itself may rest on the remembered copy (its resourceVersion precondition
        guards it); any answer given without writing is checked against a fresh read first."""
        with self._lock:
            current: PodInfo | None = self._seen.get(ref.uid)
        fresh = False
        conflicts = 0
        while conflicts < self._attempts:
            if current is None:
                current, fresh = self._read(what, ref), True
                if current is None or current.uid != ref.uid:
                    return False  # deleted (perhaps recreated under the same name)
            holds = record_generation(current.annotations) == generation
            written = all(current.annotations.get(k) == v for k, v in changes.items())
            settled = written and (holds or ALLOCATION_ANNOTATION in changes)
            if (settled or not holds) and not fresh:
                current = None  # decided on a remembered copy: confirm with the API
                continue
            if settled:
                return True  # already there (an earlier attempt whose answer was lost)
            if not holds:
                return False
            try:
                patched = self._api.patch_pod_annotations(
                    ref.namespace, ref.name, changes, current.resource_version
                )
            except KubeConflict:
                log.debug(
                    "%s %s: resourceVersion %s moved on; reading again", what, ref, current.resource_version
                )
                conflicts += 1
                current = None
                continue
            except KubeNotFound:
                return False
            except KubeError as exc:
                raise RecordStoreError(f"{what} {ref}: {exc}") from exc
            self._remember(patched)
            return True
        raise RecordStoreError(f"{what} {ref}: the pod kept changing ({self._attempts} conflicting attempts)")

    def _read(self, what: str, ref: PodRef) -> PodInfo | None:
        try:
            pod = self._api.get_pod(ref.namespace, ref.name)
        except KubeError as exc:
            raise RecordStoreError(f"{what} {ref}: {exc}") from exc
        if pod is not None:
            self._remember(pod)
        return pod

    def _remember(self, pod: PodInfo) -> None:
        with self._lock:
            self._seen[pod.uid] = pod


def _epoch(when: dt.datetime | None) -> float:
    if when is None:
        return 0.0
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()
