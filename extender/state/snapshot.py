"""An immutable view of the cluster: the one input every verb and view of the extender reads.

`extender.state.store.ClusterStore` swaps in a new `ClusterSnapshot` after each change; a
filter, prioritize, bind plan, explain or debug page takes one snapshot at its start and reads
only that, so it never sees half of a change and never holds a lock while it decides.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from contract.compute_demand import ComputeDemand
from contract.cordons import Cordons
from contract.gpu_topology import PublishedTopology
from contract.ledger import Ledger, LedgerEntry
from contract.scheduling_policy import SchedulingPolicy
from extender.state.stale_entries import PodFacts
from topology.accounting import Overcommit
from topology.fragmentation import DEFAULT_WORKLOAD, PodShape, Workload
from topology.scheduling import GpuGrant, NodeState

_EMPTY: Mapping[str, tuple[GpuGrant, ...]] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the Node object says that matters to GPU placement."""

    name: str
    cordons: Cordons = field(default_factory=Cordons)
    unschedulable: bool = False
    advertises_gpus: bool = False  # allocatable has a managed GPU resource (device plugin running)
    allocatable: ComputeDemand | None = None  # allocatable CPU and memory (None: not said)


@dataclass(frozen=True, slots=True)
class TrackedPod:
    """A pod as the extender tracks it: any pod with a GPU request or allocation, and any pod
    bound to a node (its CPU and memory count against the node's)."""

    uid: str
    namespace: str
    name: str
    node_name: str = ""
    finished: bool = False
    compute: ComputeDemand = field(default_factory=ComputeDemand)  # effective CPU/memory request
    gpu_shape: PodShape | None = None  # what it asks of GPUs, for the learned workload (None: no GPU)

    @property
    def takes_compute(self) -> bool:
        """Bound to a node and not finished: its CPU and memory are taken there."""
        return bool(self.node_name) and not self.finished

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def facts(self) -> PodFacts:
        return PodFacts(True, self.uid, self.node_name, self.finished)


@dataclass(frozen=True, slots=True)
class TrackedNode:
    """Everything known about one node, and the `NodeState` built from it (None without a
    readable GpuTopology). `version` changes with every change to any of these."""

    name: str
    version: int
    facts: NodeFacts | None = None
    published: PublishedTopology | None = None
    topology_problem: str = ""  # why the node's GpuTopology could not be read, if it could not
    ledger: Ledger = field(default_factory=lambda: Ledger(""))  # the node's ledger (empty: none)
    in_flight: Mapping[str, tuple[GpuGrant, ...]] = field(
        default_factory=lambda: _EMPTY
    )  # planned, not committed
    state: NodeState | None = None
    overcommits: tuple[Overcommit, ...] = ()
    compute_used: ComputeDemand = field(default_factory=ComputeDemand)  # requests of its bound pods

    @property
    def free_compute(self) -> ComputeDemand | None:
        """Allocatable CPU and memory minus the requests of the pods bound here (None: unknown)."""
        allocatable = self.facts.allocatable if self.facts is not None else None
        if allocatable is None:
            return None
        return ComputeDemand(
            allocatable.cpu_milli - self.compute_used.cpu_milli,
            allocatable.memory_mib - self.compute_used.memory_mib,
        )

    @property
    def mps_active(self) -> bool:
        return self.published is not None and self.published.status.mps_active

    @property
    def interposer_available(self) -> bool:
        return self.published is not None and self.published.status.interposer_available

    @property
    def known(self) -> bool:
        """The node exists as a Node or has a GpuTopology."""
        return self.facts is not None or self.published is not None


@dataclass(frozen=True, slots=True)
class PolicyBook:
    """The GpuSchedulingPolicy objects (decoded, or why they cannot be used) and the namespaces'
    default policy names."""

    policies: Mapping[str, SchedulingPolicy | str] = field(default_factory=lambda: MappingProxyType({}))
    namespace_defaults: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """The cluster at one `cluster_version`."""

    cluster_version: int = 0
    nodes: Mapping[str, TrackedNode] = field(default_factory=lambda: MappingProxyType({}))
    pods: Mapping[str, TrackedPod] = field(default_factory=lambda: MappingProxyType({}))  # by uid
    pod_uids: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))  # "ns/name" -> uid
    synced: frozenset[str] = frozenset()
    book: PolicyBook = field(default_factory=PolicyBook)
    workload: Workload = DEFAULT_WORKLOAD  # learned from the pods seen (topology.workload_learning)
    workload_version: int = 0

    def is_synced(self, kinds: Iterable[str]) -> bool:
        return all(k in self.synced for k in kinds)

    def node(self, name: str) -> TrackedNode | None:
        return self.nodes.get(name)

    def node_names(self) -> tuple[str, ...]:
        return tuple(sorted(n for n, e in self.nodes.items() if e.known))

    def node_state(self, name: str) -> NodeState | None:
        entry = self.nodes.get(name)
        return entry.state if entry is not None else None

    def node_states(self) -> list[NodeState]:
        return [s for n in self.node_names() if (s := self.nodes[n].state) is not None]

    def version(self, name: str) -> int:
        entry = self.nodes.get(name)
        return entry.version if entry is not None else -1

    def ledger(self, name: str) -> Ledger:
        entry = self.nodes.get(name)
        return entry.ledger if entry is not None and entry.ledger.node == name else Ledger(name)

    def ledgers(self) -> tuple[Ledger, ...]:
        return tuple(
            e.ledger for _, e in sorted(self.nodes.items()) if e.ledger.entries or e.ledger.resource_version
        )

    def pod(self, uid: str) -> TrackedPod | None:
        return self.pods.get(uid)

    def pod_by_key(self, namespace: str, name: str) -> TrackedPod | None:
        uid = self.pod_uids.get(f"{namespace}/{name}")
        return self.pods.get(uid) if uid else None

    def pod_facts(self, uids: Iterable[str]) -> dict[str, PodFacts]:
        return {uid: p.facts() for uid in uids if (p := self.pods.get(uid)) is not None}

    def allocation_of(self, uid: str) -> tuple[str, LedgerEntry] | None:
        """The node and ledger entry holding this pod's allocation, if any."""
        for name, entry in sorted(self.nodes.items()):
            found = entry.ledger.by_uid().get(uid)
            if found is not None:
                return name, found
        return None

    def gpu_nodes_without_topology(self) -> tuple[str, ...]:
        """Nodes whose kubelet advertises GPUs but that have no (readable) GpuTopology."""
        return tuple(
            sorted(
                n
                for n, e in self.nodes.items()
                if e.facts is not None and e.facts.advertises_gpus and e.published is None
            )
        )

    def overcommits(self) -> Mapping[str, tuple[Overcommit, ...]]:
        return {n: e.overcommits for n, e in sorted(self.nodes.items()) if e.overcommits}
