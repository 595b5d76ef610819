"""Linkpack's own policy in the simulator ("ours"): the extender's filter and node decision.

Every openb node gets a topology (`bench.cluster.topologies`) and a `topology.scheduling.NodeState`
(shares in units of 1/1000 GPU, so trace shares map exactly; whole-held GPUs marked whole).
The run keeps a `topology.workload_learning.WorkloadLearner` fed with every arriving pod before
it is scheduled, as the extender's store is fed by its pod watch. For a GPU pod, on every node
that passed the simulator's shared filter (CPU, memory, GPU model, GPU fit: the same for every
policy), exactly what `extender.placing.decisions.Decider` does under the extender's default policy
(`ExtenderConfig().policy(None)`, which decides the node):

- filter: `topology.placement.place(state, request, policy, workload)` with the learned
  workload; a `Misfit` takes the node out;
- decision: `topology.scoring.node_terms(...)` with `NodeResourcesContext` (the node's free CPU
  and memory before and after the pod, its CPU capacity, the learned workload), ranked by
  `topology.node_choice`: `rank_terms` per candidate, then `name_rank` of the node's name; the
  lowest key wins and the pod gets the GPUs `place` chose.

CPU-only pods never reach the extender (it manages GPU resources only; kube-scheduler places
them with its own scores), so they go by kube-scheduler's default scoring
(`kube_default_choice`: NodeResourcesFit LeastAllocated plus NodeResourcesBalancedAllocation
over CPU and memory, ties at random).

Speed: the terms of a node depend only on its topology kind and GPU usage (its class), the
bands of free CPU and memory the workload's needs cut before and after the pod, the whole
percent of free CPU after the pod, the node's CPU capacity and the pod's CPU request (with the
free CPU after, it gives the free CPU before); `place` runs once per (class, request) and
`node_terms` once per such key and workload version, computed from the first node met with
that key (any other gives the same terms). tests/bench checks that this equals
running the functions on every node.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from bench.cluster.cluster import Decision, SimulatedCluster
from bench.cluster.frag_table import IntArray
from bench.cluster.policy import ClusterPolicy, RunContext
from bench.cluster.topologies import topology_for
from bench.cluster.trace import MILLI_PER_GPU, TracePod
from extender.config import ExtenderConfig
from topology.fragmentation import Workload
from topology.model import NodeTopology
from topology.node_choice import best_bottleneck, name_rank, rank_terms
from topology.placement import place
from topology.scheduling import GpuShare, GpuUsage, NodeState, Placement, Policy, Request, WholeGpus
from topology.scoring import (
    CPU_SHARE_STEPS,
    NodeResourcesContext,
    RawTerms,
    default_fragmentation,
    node_terms,
)
from topology.workload_learning import WorkloadLearner

UsageKey = tuple[int, ...]  # free milli per GPU, -1 for a GPU held whole


def extender_default_policy() -> Policy:
    """The policy the extender applies to a pod that names none."""
    policy = ExtenderConfig().policy(None)
    assert policy is not None
    return policy


def request_for(pod: TracePod) -> Request | None:
    """The extender's request for a trace pod; None for a CPU-only pod."""
    if pod.gpu_count == 0:
        return None
    if pod.is_fractional:
        return GpuShare(units=pod.gpu_milli)
    return WholeGpus(pod.gpu_count)


def node_state(name: str, topology: NodeTopology, usage: UsageKey) -> NodeState:
    gpus = tuple(
        GpuUsage(whole=True) if free < 0 else GpuUsage(units_used=MILLI_PER_GPU - free) for free in usage
    )
    return NodeState(name, topology, gpus, units_per_gpu=MILLI_PER_GPU)


class Thresholds:
    """Free CPU (or memory) → the largest threshold of the workload at or below it, as an index.

    The measure compares free CPU and memory only against the typical requests' needs, so all
    values between two consecutive needs measure the same; the index names that band.
    """

    def __init__(self, needs: Iterable[int]) -> None:
        self.values: IntArray = np.array(sorted({0, *needs}), dtype=np.int64)

    def index(self, free: IntArray) -> IntArray:
        return np.searchsorted(self.values, free, side="right") - 1


class ClassBook:
    """Node classes (topology kind + GPU usage) and `place` per (class, request, workload)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.classes: dict[tuple[tuple[str, int], UsageKey], int] = {}
        self.keys: list[tuple[tuple[str, int], UsageKey]] = []
        self.states: dict[int, NodeState] = {}
        self.placements: dict[tuple[int, Request, Workload], Placement | None] = {}

    def class_id(self, kind: tuple[str, int], usage: UsageKey) -> int:
        key = (kind, usage)
        found = self.classes.get(key)
        if found is None:
            found = len(self.keys)
            self.classes[key] = found
            self.keys.append(key)
        return found

    def state_of(self, class_id: int) -> NodeState:
        state = self.states.get(class_id)
        if state is None:
            (model, count), usage = self.keys[class_id]
            state = node_state(f"class-{class_id}", topology_for(model, count), usage)
            self.states[class_id] = state
        return state

    def placement_of(self, class_id: int, request: Request, workload: Workload) -> Placement | None:
        """`place` (filter) for one class; None when it does not fit."""
        key = (class_id, request, workload)
        if key in self.placements:
            return self.placements[key]
        if len(self.placements) > 400_000:
            self.placements.clear()
        outcome = place(self.state_of(class_id), request, self.policy, workload)
        found = outcome if isinstance(outcome, Placement) else None
        self.placements[key] = found
        return found


class TermsBook:
    """`node_terms` per decision key under one learned workload (see the module docstring)."""

    def __init__(self, book: ClassBook, workload: Workload) -> None:
        self.book = book
        self.workload = workload
        shapes = [m for m in workload if m.needs_gpu]
        self.cpu = Thresholds(m.cpu_milli for m in shapes)
        self.memory = Thresholds(m.memory_mib for m in shapes if m.memory_mib)
        self.terms: dict[tuple[object, ...], RawTerms | None] = {}
        self.fragmentation = default_fragmentation()

    def terms_of(
        self, key: tuple[int, ...], class_id: int, request: Request, free: tuple[int, int, int, int, int]
    ) -> RawTerms | None:
        memo_key = (*key, request)
        if memo_key in self.terms:
            return self.terms[memo_key]
        placement = self.book.placement_of(class_id, request, self.workload)
        found = None
        if placement is not None:
            cpu_before, memory_before, cpu_after, memory_after, capacity = free
            resources = NodeResourcesContext(
                cpu_before, memory_before, cpu_after, memory_after, self.workload, capacity
            )
            found = node_terms(
                self.book.state_of(class_id),
                placement,
                request,
                self.book.policy,
                self.fragmentation,
                resources,
            )
        self.terms[memo_key] = found
        return found


def kube_default_choice(
    cluster: SimulatedCluster,
    pod: TracePod,
    feasible: IntArray,
    rng: np.random.Generator,
    most_allocated: bool = True,
) -> int:
    """kube-scheduler's node for a pod without GPUs under Linkpack's scheduler profile:
    NodeResourcesFit (MostAllocated, or LeastAllocated as kube-scheduler's own default) plus
    NodeResourcesBalancedAllocation, over CPU and memory with equal weights, integer scores
    0..100 each, summed; ties at random."""
    cpu_cap = np.maximum(cluster.cpu_capacity[feasible], 1)
    mem_cap = np.maximum(cluster.memory_capacity[feasible], 1)
    cpu_req = cpu_cap - cluster.cpu_left[feasible] + pod.cpu_milli
    mem_req = mem_cap - cluster.memory_left[feasible] + pod.memory_mib
    if most_allocated:
        fit = (cpu_req * 100 // cpu_cap + mem_req * 100 // mem_cap) // 2
    else:
        fit = ((cpu_cap - cpu_req) * 100 // cpu_cap + (mem_cap - mem_req) * 100 // mem_cap) // 2
    cpu_frac = np.minimum(1.0, cpu_req / cpu_cap)
    mem_frac = np.minimum(1.0, mem_req / mem_cap)
    balanced = np.trunc((1.0 - np.abs(cpu_frac - mem_frac) / 2.0) * 100).astype(np.int64)
    score = fit + balanced
    best = np.flatnonzero(score == score.max())
    return int(feasible[best[int(rng.integers(len(best)))]])


class OursPolicy:
    def __init__(
        self,
        context: RunContext,
        book: ClassBook,
        terms_books: dict[Workload, TermsBook],
        cpu_only: str = "first",
    ):
        cluster = context.cluster
        self.cpu_only = cpu_only
        self.rng = context.rng
        self.book = book
        self.terms_books = terms_books
        self.learner = WorkloadLearner()
        self.kinds = [(n.model, n.gpu_count) for n in cluster.nodes]
        self.names = [n.name for n in cluster.nodes]
        self.rank: IntArray = np.array([name_rank(n) for n in self.names], dtype=np.int64)
        capacities = sorted(set(cluster.cpu_capacity.tolist()))
        assert len(capacities) <= 64 and len(self.book.keys) < 2**20
        self.capacity_index: IntArray = np.searchsorted(np.array(capacities), cluster.cpu_capacity)
        self.class_of: IntArray = np.zeros(cluster.size, dtype=np.int64)
        self._versions = cluster.version.copy()
        for node in range(cluster.size):
            self.class_of[node] = self._class_id(cluster, node)

    def observe(self, pod: TracePod) -> None:
        """The extender's store sees every pod as it is created, before it is scheduled."""
        self.learner.observe(pod.shape)

    def _class_id(self, cluster: SimulatedCluster, node: int) -> int:
        count = int(cluster.gpu_count[node])
        row = cluster.gpu_left[node, :count].tolist()
        held = cluster.whole_held[node, :count].tolist()
        usage = tuple(-1 if h else int(v) for v, h in zip(row, held, strict=True))
        return self.book.class_id(self.kinds[node], usage)

    def _refresh_classes(self, cluster: SimulatedCluster) -> None:
        changed = np.flatnonzero(cluster.version != self._versions)
        for node in changed.tolist():
            self.class_of[node] = self._class_id(cluster, node)
        self._versions[changed] = cluster.version[changed]

    def _terms_book(self) -> TermsBook:
        workload = self.learner.workload
        found = self.terms_books.get(workload)
        if found is None:
            if len(self.terms_books) >= 64:
                self.terms_books.pop(next(iter(self.terms_books)))
            found = self.terms_books[workload] = TermsBook(self.book, workload)
        return found

    def decide(self, cluster: SimulatedCluster, pod: TracePod, feasible: IntArray) -> Decision | None:
        request = request_for(pod)
        if request is None:
            if self.cpu_only == "first":
                return Decision(int(feasible[np.argmin(self.rank[feasible])]), ())
            return Decision(
                kube_default_choice(cluster, pod, feasible, self.rng, self.cpu_only == "most"), ()
            )
        self._refresh_classes(cluster)
        terms_book = self._terms_book()
        cpu, memory = terms_book.cpu, terms_book.memory
        cpu_left = cluster.cpu_left[feasible]
        memory_left = cluster.memory_left[feasible]
        capacity = cluster.cpu_capacity[feasible]
        cpu_after = cpu_left - pod.cpu_milli
        memory_after = memory_left - pod.memory_mib
        percent = np.clip(CPU_SHARE_STEPS * cpu_after // np.maximum(capacity, 1), 0, CPU_SHARE_STEPS)
        # one int64 per node: class, the four bands, the CPU percent, the capacity's index
        packed = self.class_of[feasible]
        for column, size in (
            (cpu.index(cpu_left), 64),
            (cpu.index(cpu_after), 64),
            (memory.index(memory_left), 64),
            (memory.index(memory_after), 64),
            (percent, 128),
            (self.capacity_index[feasible], 64),
        ):
            packed = packed * size + column
        keys, first, inverse = np.unique(packed, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
        terms: list[RawTerms | None] = []
        for k, row in zip(keys.tolist(), first.tolist(), strict=True):
            free = (
                int(cpu_left[row]),
                int(memory_left[row]),
                int(cpu_after[row]),
                int(memory_after[row]),
                int(capacity[row]),
            )
            class_id = int(self.class_of[feasible[row]])
            terms.append(terms_book.terms_of((k, pod.cpu_milli), class_id, request, free))
        fitting = [t for t in terms if t is not None]
        if not fitting:
            return None
        best = best_bottleneck(fitting)
        key_ranks = [rank_terms(t, best) if t is not None else None for t in terms]
        ok = np.array([r is not None for r in key_ranks], dtype=np.bool_)[inverse]
        width = len(next(r for r in key_ranks if r is not None))
        table = np.array([r if r is not None else (0,) * width for r in key_ranks], dtype=np.int64)
        nodes = feasible[ok]
        ranked = table[inverse[ok]]
        order = np.lexsort((self.rank[nodes], *[ranked[:, i] for i in reversed(range(width))]))
        chosen = int(nodes[order[0]])
        # equal CRC-32 ranks would fall back to the name; the trace's names have none
        placement = terms[int(inverse[np.flatnonzero(feasible == chosen)[0]])]
        assert placement is not None
        return Decision(chosen, placement.placement.gpus)


def ours_factory(
    policy: Policy | None = None, cpu_only: str = "first"
) -> Callable[[RunContext], ClusterPolicy]:
    """ "ours" under the extender's default policy; placements and terms are shared across the
    runs it builds. `cpu_only`: where pods without GPUs go ("first": the first feasible node in
    the fixed name order; "least" / "most": kube-scheduler's LeastAllocated / MostAllocated
    scoring with BalancedAllocation)."""
    book = ClassBook(policy or extender_default_policy())
    terms_books: dict[Workload, TermsBook] = {}

    def build(context: RunContext) -> ClusterPolicy:
        return OursPolicy(context, book, terms_books, cpu_only)

    return build
