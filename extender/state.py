"""The extender's live view of the cluster, fed by watches and read by every verb.

Writers (watch threads, the binder) call the `apply_*` methods; readers take immutable
`NodeState` values that are rebuilt only when something about that node changed. Nothing
here talks to Kubernetes: the adapter translates events into these calls.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from extender.ledger import Ledger, LedgerEntry, PodFacts
from topology.accounting import Overcommit, node_state_from_grants
from topology.model import NodeTopology
from topology.workload import GpuGrant, NodeState

CORDON_ANNOTATION = "linkpack.io/cordoned-gpus"
_CHANGE_LOG_LIMIT = 100_000


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the Node object says that matters to GPU placement."""

    name: str
    cordoned_uuids: frozenset[str] = frozenset()
    unschedulable: bool = False
    advertises_gpus: bool = False  # allocatable has a managed GPU resource (device plugin running)


@dataclass(frozen=True, slots=True)
class TopologyRecord:
    """A node's published topology and the GPUs its agent reports unhealthy (by index)."""

    topology: NodeTopology
    unhealthy: frozenset[int] = frozenset()
    content_hash: str = ""


@dataclass(frozen=True, slots=True)
class PodView:
    """A pod as the extender tracks it (any pod with a GPU allocation or one being bound)."""

    uid: str
    namespace: str
    name: str
    node_name: str = ""
    finished: bool = False

    def facts(self) -> PodFacts:
        return PodFacts(True, self.uid, self.node_name, self.finished)


@dataclass
class _NodeEntry:
    facts: NodeFacts | None = None
    record: TopologyRecord | None = None
    ledger: Ledger | None = None
    in_flight: dict[str, tuple[GpuGrant, ...]] = field(default_factory=dict)
    version: int = 0
    cached: NodeState | None = None
    cached_problems: tuple[Overcommit, ...] = ()


class ClusterState:
    """Thread-safe store of nodes, topology records, ledgers, tracked pods and in-flight binds."""

    def __init__(self, units_per_gpu: int) -> None:
        self._units_per_gpu = units_per_gpu
        self._lock = threading.RLock()
        self._nodes: dict[str, _NodeEntry] = {}
        self._pods: dict[str, PodView] = {}  # by uid
        self._pod_uid_by_key: dict[str, str] = {}  # "ns/name" -> uid
        self._synced: set[str] = set()
        self._generation = 0  # bumped with every change to any node
        self._change_log: list[str] = []  # node changed at generation (base + i + 1)
        self._change_base = 0

    # ------------------------------------------------------------------ writers

    def apply_node(self, facts: NodeFacts) -> None:
        with self._lock:
            self._touch(facts.name).facts = facts

    def remove_node(self, name: str) -> None:
        with self._lock:
            entry = self._touch(name)
            entry.facts = None

    def apply_topology(self, node: str, record: TopologyRecord | None) -> None:
        with self._lock:
            self._touch(node).record = record

    def apply_ledger(self, ledger: Ledger) -> None:
        with self._lock:
            entry = self._touch(ledger.node)
            current = entry.ledger
            if current is not None and _newer(current.resource_version, ledger.resource_version):
                return  # an older event arriving late never rolls the ledger back
            entry.ledger = ledger
            for uid in ledger.by_uid():
                entry.in_flight.pop(uid, None)

    def remove_ledger(self, node: str) -> None:
        with self._lock:
            self._touch(node).ledger = None

    def apply_pod(self, pod: PodView) -> None:
        with self._lock:
            old_uid = self._pod_uid_by_key.get(f"{pod.namespace}/{pod.name}")
            if old_uid and old_uid != pod.uid:
                self._pods.pop(old_uid, None)
            self._pods[pod.uid] = pod
            self._pod_uid_by_key[f"{pod.namespace}/{pod.name}"] = pod.uid

    def remove_pod(self, uid: str) -> None:
        with self._lock:
            pod = self._pods.pop(uid, None)
            if pod is not None and self._pod_uid_by_key.get(f"{pod.namespace}/{pod.name}") == uid:
                del self._pod_uid_by_key[f"{pod.namespace}/{pod.name}"]
            for name, entry in self._nodes.items():
                if entry.in_flight.pop(uid, None) is not None:
                    self._bump(entry, name)

    def begin_bind(self, node: str, uid: str, grants: tuple[GpuGrant, ...]) -> None:
        """Count a bind's grants as taken until its ledger commit is seen or it is abandoned."""
        with self._lock:
            self._touch(node).in_flight[uid] = grants

    def end_bind(self, node: str, uid: str) -> None:
        with self._lock:
            entry = self._nodes.get(node)
            if entry is not None and entry.in_flight.pop(uid, None) is not None:
                self._bump(entry, node)

    def mark_synced(self, kind: str) -> None:
        with self._lock:
            self._synced.add(kind)

    # ------------------------------------------------------------------ readers

    def synced(self, kinds: Iterable[str]) -> bool:
        with self._lock:
            return all(k in self._synced for k in kinds)

    def node_names(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(
                sorted(n for n, e in self._nodes.items() if e.facts is not None or e.record is not None)
            )

    def node_facts(self, name: str) -> NodeFacts | None:
        with self._lock:
            entry = self._nodes.get(name)
            return entry.facts if entry else None

    def topology_record(self, name: str) -> TopologyRecord | None:
        with self._lock:
            entry = self._nodes.get(name)
            return entry.record if entry else None

    def gpu_nodes_without_topology(self) -> tuple[str, ...]:
        """Nodes whose kubelet advertises GPUs but that have no (valid) topology record."""
        with self._lock:
            return tuple(
                sorted(
                    n
                    for n, e in self._nodes.items()
                    if e.facts is not None and e.facts.advertises_gpus and e.record is None
                )
            )

    def ledger(self, name: str) -> Ledger:
        with self._lock:
            entry = self._nodes.get(name)
            return entry.ledger if entry and entry.ledger else Ledger(name)

    def ledgers(self) -> tuple[Ledger, ...]:
        with self._lock:
            return tuple(e.ledger for _, e in sorted(self._nodes.items()) if e.ledger is not None)

    def pod(self, uid: str) -> PodView | None:
        with self._lock:
            return self._pods.get(uid)

    def pod_by_key(self, namespace: str, name: str) -> PodView | None:
        with self._lock:
            uid = self._pod_uid_by_key.get(f"{namespace}/{name}")
            return self._pods.get(uid) if uid else None

    def pod_facts(self, uids: Iterable[str]) -> dict[str, PodFacts]:
        with self._lock:
            return {uid: p.facts() for uid in uids if (p := self._pods.get(uid)) is not None}

    def allocation_of(self, uid: str) -> tuple[str, LedgerEntry] | None:
        """The node and ledger entry holding this pod's allocation, if any."""
        with self._lock:
            for name, entry in self._nodes.items():
                if entry.ledger is not None:
                    found = entry.ledger.by_uid().get(uid)
                    if found is not None:
                        return name, found
            return None

    def node_state(self, name: str) -> NodeState | None:
        """The node's current state; None when it has no topology record."""
        with self._lock:
            entry = self._nodes.get(name)
            if entry is None or entry.record is None:
                return None
            if entry.cached is None:
                entry.cached, entry.cached_problems = self._build(name, entry)
            return entry.cached

    def node_versions(self, names: Iterable[str]) -> list[int]:
        """Each node's state version (-1 for unknown nodes), read under one lock."""
        with self._lock:
            nodes = self._nodes
            return [e.version if (e := nodes.get(n)) is not None else -1 for n in names]

    def overcommits(self) -> Mapping[str, tuple[Overcommit, ...]]:
        with self._lock:
            for name in list(self._nodes):
                self.node_state(name)
            return {n: e.cached_problems for n, e in sorted(self._nodes.items()) if e.cached_problems}

    # ------------------------------------------------------------------ internals

    def _touch(self, name: str) -> _NodeEntry:
        entry = self._nodes.get(name)
        if entry is None:
            entry = self._nodes[name] = _NodeEntry()
        self._bump(entry, name)
        return entry

    def _bump(self, entry: _NodeEntry, name: str = "") -> None:
        entry.version += 1
        entry.cached = None
        self._generation += 1
        self._change_log.append(name)
        if len(self._change_log) > _CHANGE_LOG_LIMIT:
            drop = len(self._change_log) // 2
            del self._change_log[:drop]
            self._change_base += drop

    def changes_since(self, generation: int) -> tuple[int, frozenset[str] | None]:
        """The current generation and the nodes changed after `generation` (None if forgotten)."""
        with self._lock:
            if generation < self._change_base:
                return self._generation, None
            return self._generation, frozenset(self._change_log[generation - self._change_base :])

    def _build(self, name: str, entry: _NodeEntry) -> tuple[NodeState, tuple[Overcommit, ...]]:
        assert entry.record is not None
        topology = entry.record.topology
        grants: list[GpuGrant] = list(entry.ledger.grants()) if entry.ledger else []
        for in_flight in entry.in_flight.values():
            grants.extend(in_flight)
        cordoned = entry.facts.cordoned_uuids if entry.facts else frozenset()
        cordoned_idx = frozenset(g.index for g in topology.gpus if g.uuid in cordoned)
        if entry.facts is not None and entry.facts.unschedulable:
            cordoned_idx = frozenset(range(topology.gpu_count))
        return node_state_from_grants(
            name, topology, grants, self._units_per_gpu, entry.record.unhealthy, cordoned_idx
        )


def _newer(a: str, b: str) -> bool:
    """True when resourceVersion `a` is known to be newer than `b` (both numeric, as etcd's are)."""
    if a.isdigit() and b.isdigit():
        return int(a) > int(b)
    return False


def parse_cordons(raw: str | None) -> frozenset[str]:
    """GPU UUIDs from the node annotation `linkpack.io/cordoned-gpus` ("GPU-a,GPU-b")."""
    if not raw:
        return frozenset()
    return frozenset(part.strip() for part in raw.split(",") if part.strip())
