"""The extender's live view of the cluster, fed by watches and the binder, read as snapshots.

Writers (watch threads, the binder) call the `apply_*` methods under one lock; they change
mutable parts and mark the node dirty. `snapshot()` rebuilds the dirty nodes' immutable
`TrackedNode` (and their `NodeState`, through the one builder in `contract.node_state`) and
swaps in a new `ClusterSnapshot`; between changes every reader shares the same snapshot.
Nothing here talks to Kubernetes: the adapter translates events into these calls.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from contract.compute_demand import ComputeDemand
from contract.gpu_topology import PublishedTopology
from contract.handoff import held_outside, revision_at_least
from contract.ledger import Ledger
from contract.node_state import build_node_state
from contract.scheduling_policy import SchedulingPolicy
from extender.state.snapshot import ClusterSnapshot, NodeFacts, PolicyBook, TrackedNode, TrackedPod
from topology.accounting import Overcommit
from topology.scheduling import GpuGrant, NodeState
from topology.workload_learning import LearningSettings, WorkloadLearner

_CHANGE_LOG_LIMIT = 100_000


@dataclass
class _NodeParts:
    facts: NodeFacts | None = None
    published: PublishedTopology | None = None
    topology_problem: str = ""
    ledger: Ledger | None = None
    in_flight: dict[str, tuple[GpuGrant, ...]] = field(default_factory=dict)
    compute: dict[str, ComputeDemand] = field(default_factory=dict)  # bound, unfinished pods by uid
    version: int = 0


class ClusterStore:
    """Thread-safe store of nodes, GpuTopology objects, ledgers, tracked pods and binds in flight."""

    def __init__(self, units_per_gpu: int, learning: LearningSettings | None = None) -> None:
        self._units_per_gpu = units_per_gpu
        self._learner = WorkloadLearner(learning)
        self._lock = threading.RLock()
        self._parts: dict[str, _NodeParts] = {}
        self._entries: dict[str, TrackedNode] = {}
        self._dirty: set[str] = set()
        self._pods: dict[str, TrackedPod] = {}  # by uid
        self._pod_uids: dict[str, str] = {}  # "ns/name" -> uid
        self._synced: set[str] = set()
        self._cluster_version = 0  # bumped with every change to any node
        self._change_log: list[str] = []  # node changed at cluster_version (base + i + 1)
        self._change_base = 0
        self._snapshot: ClusterSnapshot | None = ClusterSnapshot()
        self._pods_view: tuple[Mapping[str, TrackedPod], Mapping[str, str]] | None = None
        self._policies: dict[str, SchedulingPolicy | str] = {}
        self._namespace_defaults: dict[str, str] = {}
        self._book: PolicyBook = PolicyBook()
        self._pods_revision = ""  # of the last pod event applied or about to be (`contract.handoff`)
        self._departures: dict[str, str] = {}  # pod uid -> pods revision when its departure was seen
        self._admitting: dict[str, bool] = {}  # node -> whether it took new pods at the last look

    # ------------------------------------------------------------------ writers

    def apply_node(self, facts: NodeFacts) -> None:
        with self._lock:
            self._touch(facts.name).facts = facts

    def remove_node(self, name: str) -> None:
        with self._lock:
            self._touch(name).facts = None

    def apply_topology(self, node: str, published: PublishedTopology | None, problem: str = "") -> None:
        """The node's GpuTopology (None: deleted, or unreadable for the reason `problem`)."""
        with self._lock:
            parts = self._touch(node)
            parts.published, parts.topology_problem = published, problem

    def apply_ledger(self, ledger: Ledger) -> None:
        with self._lock:
            parts = self._parts.get(ledger.node)
            stored = parts.ledger if parts is not None else None
            if stored is not None and _newer(stored.resource_version, ledger.resource_version):
                return  # an older event arriving late never rolls the ledger back
            parts = self._touch(ledger.node)
            parts.ledger = ledger
            for uid in ledger.by_uid():
                parts.in_flight.pop(uid, None)

    def remove_ledger(self, node: str) -> None:
        with self._lock:
            self._touch(node).ledger = None

    def apply_pod(self, pod: TrackedPod) -> None:
        with self._lock:
            old_uid = self._pod_uids.get(pod.key)
            if old_uid and old_uid != pod.uid:
                self._pods.pop(old_uid, None)
            previous = self._pods.get(pod.uid)
            if previous == pod:
                return
            if previous is None and pod.gpu_shape is not None and self._learner.observe(pod.gpu_shape):
                self._snapshot = None
            self._move_compute(previous, pod)
            self._pods[pod.uid] = pod
            self._pod_uids[pod.key] = pod.uid
            self._pods_view = self._snapshot = None

    def remove_pod(self, uid: str) -> None:
        with self._lock:
            pod = self._pods.pop(uid, None)
            if pod is not None and self._pod_uids.get(pod.key) == uid:
                del self._pod_uids[pod.key]
            self._move_compute(pod, None)
            self._pods_view = self._snapshot = None
            for name, parts in self._parts.items():
                if parts.in_flight.pop(uid, None) is not None:
                    self._bump(name, parts)

    def apply_pods_revision(self, revision: str) -> None:
        """The pods watch is at `revision` (told before the event of that revision is applied)."""
        with self._lock:
            if not revision_at_least(self._pods_revision, revision) or not self._pods_revision:
                self._pods_revision = revision

    def note_departure(self, uid: str) -> str:
        """The pods revision when this pod's departure was first noted (call after the snapshot
        that shows the departure): the node must have looked at or after it (`contract.handoff`)."""
        with self._lock:
            return self._departures.setdefault(uid, self._pods_revision)

    def note_admitting(self, node: str, admitting: bool) -> bool:
        """Remember whether the node takes new pods; True when it just started to again."""
        with self._lock:
            before = self._admitting.get(node, True)
            self._admitting[node] = admitting
            return admitting and not before

    def forget_departures(self, keep: set[str]) -> None:
        with self._lock:
            self._departures = {uid: rv for uid, rv in self._departures.items() if uid in keep}

    def begin_bind(self, node: str, uid: str, grants: tuple[GpuGrant, ...]) -> None:
        """Count a bind's grants as taken until its ledger commit is seen or it is abandoned."""
        with self._lock:
            self._touch(node).in_flight[uid] = grants

    def end_bind(self, node: str, uid: str) -> None:
        with self._lock:
            parts = self._parts.get(node)
            if parts is not None and parts.in_flight.pop(uid, None) is not None:
                self._bump(node, parts)

    def apply_policy(self, name: str, policy: SchedulingPolicy | None, problem: str = "") -> None:
        """A GpuSchedulingPolicy (None with `problem`: it exists but cannot be used)."""
        with self._lock:
            self._policies[name] = policy if policy is not None else problem
            self._book_changed()

    def remove_policy(self, name: str) -> None:
        with self._lock:
            if self._policies.pop(name, None) is not None:
                self._book_changed()

    def apply_namespace(self, name: str, default_policy: str | None) -> None:
        with self._lock:
            if self._namespace_defaults.get(name) == default_policy:
                return
            if default_policy:
                self._namespace_defaults[name] = default_policy
            else:
                self._namespace_defaults.pop(name, None)
            self._book_changed()

    def remove_namespace(self, name: str) -> None:
        self.apply_namespace(name, None)

    def _book_changed(self) -> None:
        self._book = PolicyBook(
            MappingProxyType(dict(self._policies)), MappingProxyType(dict(self._namespace_defaults))
        )
        self._snapshot = None

    def mark_synced(self, kind: str) -> None:
        with self._lock:
            if kind not in self._synced:
                self._synced.add(kind)
                self._snapshot = None

    # ------------------------------------------------------------------ readers

    def snapshot(self) -> ClusterSnapshot:
        """The cluster now, as one immutable value."""
        with self._lock:
            current = self._snapshot
            if current is not None:
                return current
            for name in sorted(self._dirty):
                self._entries[name] = self._entry(name, self._parts[name])
            self._dirty.clear()
            if self._pods_view is None:
                self._pods_view = (MappingProxyType(dict(self._pods)), MappingProxyType(dict(self._pod_uids)))
            pods, pod_uids = self._pods_view
            current = self._snapshot = ClusterSnapshot(
                cluster_version=self._cluster_version,
                nodes=MappingProxyType(dict(self._entries)),
                pods=pods,
                pod_uids=pod_uids,
                synced=frozenset(self._synced),
                book=self._book,
                workload=self._learner.workload,
                workload_version=self._learner.version,
            )
            return current

    def changes_between(self, since: int, until: int) -> frozenset[str] | None:
        """Nodes changed after cluster_version `since` up to `until` (None when no longer known)."""
        with self._lock:
            if since < self._change_base or until > self._cluster_version or since > until:
                return None
            return frozenset(self._change_log[since - self._change_base : until - self._change_base])

    # ------------------------------------------------------------------ internals

    def _move_compute(self, old: TrackedPod | None, new: TrackedPod | None) -> None:
        """Move a pod's CPU and memory between the nodes it held them on before and holds now."""
        before = (old.node_name, old.compute) if old is not None and old.takes_compute else None
        after = (new.node_name, new.compute) if new is not None and new.takes_compute else None
        if before == after:
            return
        uid = new.uid if new is not None else old.uid if old is not None else ""
        if before is not None:
            parts = self._parts.get(before[0])
            if parts is not None and parts.compute.pop(uid, None) is not None:
                self._bump(before[0], parts)
        if after is not None:
            parts = self._parts.get(after[0])
            if parts is None:
                parts = self._parts[after[0]] = _NodeParts()
            parts.compute[uid] = after[1]
            self._bump(after[0], parts)

    def _touch(self, name: str) -> _NodeParts:
        parts = self._parts.get(name)
        if parts is None:
            parts = self._parts[name] = _NodeParts()
        self._bump(name, parts)
        return parts

    def _bump(self, name: str, parts: _NodeParts) -> None:
        parts.version += 1
        self._dirty.add(name)
        self._snapshot = None
        self._cluster_version += 1
        self._change_log.append(name)
        if len(self._change_log) > _CHANGE_LOG_LIMIT:
            drop = len(self._change_log) // 2
            del self._change_log[:drop]
            self._change_base += drop

    def _entry(self, name: str, parts: _NodeParts) -> TrackedNode:
        state: NodeState | None = None
        overcommits: tuple[Overcommit, ...] = ()
        if parts.published is not None:
            grants: list[GpuGrant] = list(parts.ledger.grants()) if parts.ledger is not None else []
            for in_flight in parts.in_flight.values():
                grants.extend(in_flight)
            # what the node still holds beyond the ledger (departed pods, swapped records) is not free
            carried = (
                {e.pod_uid: (f"{e.namespace}/{e.name}", e.allocation.grants) for e in parts.ledger.entries}
                if parts.ledger
                else {}
            )
            grants.extend(held_outside(parts.published.status.holds, carried))
            facts = parts.facts
            state, overcommits = build_node_state(
                parts.published,
                grants,
                self._units_per_gpu,
                facts.cordons if facts is not None else None,
                facts.unschedulable if facts is not None else False,
            )
        return TrackedNode(
            name=name,
            version=parts.version,
            facts=parts.facts,
            published=parts.published,
            topology_problem=parts.topology_problem,
            ledger=parts.ledger if parts.ledger is not None else Ledger(name),
            in_flight=MappingProxyType(dict(parts.in_flight)),
            state=state,
            overcommits=overcommits,
            compute_used=ComputeDemand(
                sum(c.cpu_milli for c in parts.compute.values()),
                sum(c.memory_mib for c in parts.compute.values()),
            ),
        )


def _newer(a: str, b: str) -> bool:
    """True when resourceVersion `a` is known to be newer than `b` (both numeric, as etcd's are)."""
    if a.isdigit() and b.isdigit():
        return int(a) > int(b)
    return False
