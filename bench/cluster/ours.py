"""Linkpack's own policy in the simulator ("ours"): the extender's filter, prioritize and placement.

Every openb node gets a topology (`bench.cluster.topologies`) and a `topology.scheduling.NodeState`
(shares in units of 1/1000 GPU, so trace shares map exactly; whole-held GPUs marked whole).
For a GPU pod, on every node that passed the simulator's shared filter (CPU, memory, GPU
model, GPU fit: the same for every policy):

- filter: `topology.placement.place(state, request, policy)`, as `extender.decisions.Decider`
  does; a `Misfit` takes the node out;
- prioritize: `topology.scoring.node_terms(state, placement, request, policy, fragmentation)`
  per node and `topology.scoring.combine(terms, policy)` over the candidates, with the policy
  and the fragmentation measure the extender uses by default
  (`extender.config.ExtenderConfig().policy(None)`, `topology.scoring.default_fragmentation()`);
- the node with the highest integer score wins; ties go to the seed's fixed node order,
  as for every other policy; the pod gets the GPUs `place` chose.

"ours+cpu" (`ours_cpu_factory`) is the same, except that `node_terms` also gets each node's
free CPU and memory before and after the pod and the trace's typical workload
(`topology.scoring.NodeResourcesContext`): what the extender's scoring would do if it tracked
node CPU, which it does not yet. Its memo key adds the bands of free CPU and memory the
workload's needs cut (`Thresholds`), so it stays exact and nearly as fast.

CPU-only pods never reach the extender (it manages GPU resources only, and answers score 0
for everything else), so they go to the first feasible node in the fixed order.

Speed: nodes with the same topology and usage give the same `place` result and terms, so they
form a class; `place` and `node_terms` run once per (class, request), the way the extender
memoises them per node version, and `combine` scores one representative per class. That is
exact because `combine` scores each candidate on its own terms plus, for multi-GPU sets, the
best candidate's link values, which duplicates do not change (tests/bench checks it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from bench.cluster.cluster import Decision, SimulatedCluster
from bench.cluster.frag_table import IntArray
from bench.cluster.policy import ClusterPolicy, RunContext, pick_best
from bench.cluster.topologies import topology_for
from bench.cluster.trace import MILLI_PER_GPU, TracePod
from extender.config import ExtenderConfig
from topology.fragmentation import Workload
from topology.model import NodeTopology
from topology.placement import place
from topology.scheduling import GpuShare, GpuUsage, NodeState, Placement, Policy, Request, WholeGpus
from topology.scoring import (
    Fragmentation,
    NodeResourcesContext,
    RawTerms,
    combine,
    default_fragmentation,
    node_terms,
)

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


class PlacementMemo:
    """Node classes (topology kind + usage), and per (class, request) the extender's terms.

    Shared by the runs one factory builds (one policy), like the extender's per-node memo.
    """

    def __init__(self, policy: Policy, fragmentation: Fragmentation) -> None:
        self.policy = policy
        self.fragmentation = fragmentation
        self.classes: dict[tuple[tuple[str, int], UsageKey], int] = {}
        self.keys: list[tuple[tuple[str, int], UsageKey]] = []
        self.states: dict[int, NodeState] = {}
        self.placements: dict[tuple[int, Request], Placement | None] = {}
        self.terms: dict[tuple[int, Request], RawTerms | None] = {}

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

    def placement_of(self, class_id: int, request: Request) -> Placement | None:
        """`place` (filter) for one class; None when it does not fit."""
        key = (class_id, request)
        if key in self.placements:
            return self.placements[key]
        outcome = place(self.state_of(class_id), request, self.policy)
        found = outcome if isinstance(outcome, Placement) else None
        self.placements[key] = found
        return found

    def terms_of(self, class_id: int, request: Request) -> RawTerms | None:
        """`place` (filter) then `node_terms` (prioritize) for one class; None when it does not fit."""
        key = (class_id, request)
        if key in self.terms:
            return self.terms[key]
        placement = self.placement_of(class_id, request)
        found = None
        if placement is not None:
            found = node_terms(self.state_of(class_id), placement, request, self.policy, self.fragmentation)
        self.terms[key] = found
        return found


class OursPolicy:
    def __init__(self, context: RunContext, memo: PlacementMemo):
        cluster = context.cluster
        self.priority = context.priority
        self.memo = memo
        self.kinds = [(n.model, n.gpu_count) for n in cluster.nodes]
        self.class_of: IntArray = np.zeros(cluster.size, dtype=np.int64)
        self._versions = cluster.version.copy()
        for node in range(cluster.size):
            self.class_of[node] = self._class_id(cluster, node)

    def _class_id(self, cluster: SimulatedCluster, node: int) -> int:
        count = int(cluster.gpu_count[node])
        row = cluster.gpu_left[node, :count].tolist()
        held = cluster.whole_held[node, :count].tolist()
        usage = tuple(-1 if h else int(v) for v, h in zip(row, held, strict=True))
        return self.memo.class_id(self.kinds[node], usage)

    def _refresh_classes(self, cluster: SimulatedCluster) -> None:
        changed = np.flatnonzero(cluster.version != self._versions)
        for node in changed.tolist():
            self.class_of[node] = self._class_id(cluster, node)
        self._versions[changed] = cluster.version[changed]

    def _keys(self, cluster: SimulatedCluster, pod: TracePod, feasible: IntArray) -> IntArray:
        """Per feasible node, a key such that equal keys give equal terms."""
        return self.class_of[feasible]

    def _terms(self, key: int, request: Request) -> RawTerms | None:
        return self.memo.terms_of(key, request)

    def decide(self, cluster: SimulatedCluster, pod: TracePod, feasible: IntArray) -> Decision | None:
        request = request_for(pod)
        if request is None:
            return Decision(pick_best(np.zeros(len(feasible)), feasible, self.priority), ())
        self._refresh_classes(cluster)
        keys, inverse = np.unique(self._keys(cluster, pod, feasible), return_inverse=True)
        terms = [self._terms(k, request) for k in keys.tolist()]
        fitting = [i for i, t in enumerate(terms) if t is not None]
        if not fitting:
            return None
        ranking = combine([t for t in terms if t is not None], self.memo.policy)
        key_scores = np.full(len(keys), -1, dtype=np.int64)
        key_scores[fitting] = ranking.scores
        best = pick_best(key_scores[inverse], feasible, self.priority)
        chosen = terms[int(inverse[np.flatnonzero(feasible == best)[0]])]
        assert chosen is not None
        return Decision(best, chosen.placement.gpus)


def ours_factory(policy: Policy | None = None) -> Callable[[RunContext], ClusterPolicy]:
    """ "ours" with the extender's default policy; terms are shared across the runs it builds."""
    memo = PlacementMemo(policy or extender_default_policy(), default_fragmentation())

    def build(context: RunContext) -> ClusterPolicy:
        return OursPolicy(context, memo)

    return build


# ----------------------------------------------------------------------------- ours+cpu


def scoring_workload(workload: Workload) -> Workload:
    """The typical workload "ours+cpu" scores against: the trace's M without its CPU-only shapes.

    M is the workload FGD gets (`bench.cluster.trace.paper_workload`: the trace's most popular
    pod shapes, CPU included) and stands for the workload an extender would learn from the pods
    it sees. CPU-only shapes are dropped, as in `topology.fragmentation.DEFAULT_WORKLOAD`: they
    add the same amount to every node's delta for a pod, which only shifts the absolute sigmoid
    of the fragmentation term.
    """
    return tuple(m for m in workload if m.needs_gpu)


class Thresholds:
    """Free CPU (or memory) → the largest threshold of the workload at or below it, as an index.

    The measure compares free CPU and memory only against the typical requests' needs, so all
    values between two consecutive needs measure the same; the index names that band.
    """

    def __init__(self, needs: Iterable[int]) -> None:
        self.values: IntArray = np.array(sorted({0, *needs}), dtype=np.int64)

    def index(self, free: IntArray) -> IntArray:
        return np.searchsorted(self.values, free, side="right") - 1

    def value(self, index: int) -> int:
        return int(self.values[index])


class CpuMemo:
    """ "ours+cpu" terms per (node class, request, CPU and memory bands before and after the pod)."""

    def __init__(self, base: PlacementMemo, workload: Workload) -> None:
        self.base = base
        self.workload = scoring_workload(workload)
        gpu_shapes = [m for m in self.workload if m.needs_gpu]
        self.cpu = Thresholds(m.cpu_milli for m in gpu_shapes)
        self.memory = Thresholds(m.memory_mib for m in gpu_shapes if m.memory_mib)
        self.terms: dict[tuple[int, Request], RawTerms | None] = {}

    def terms_of(self, key: int, request: Request) -> RawTerms | None:
        memo_key = (key, request)
        if memo_key in self.terms:
            return self.terms[memo_key]
        nc, nm = len(self.cpu.values), len(self.memory.values)
        key, mem_after = divmod(key, nm)
        key, mem_before = divmod(key, nm)
        key, cpu_after = divmod(key, nc)
        class_id, cpu_before = divmod(key, nc)
        placement = self.base.placement_of(class_id, request)
        found = None
        if placement is not None:
            resources = NodeResourcesContext(
                free_cpu_milli_before=self.cpu.value(cpu_before),
                free_memory_mib_before=self.memory.value(mem_before),
                free_cpu_milli_after=self.cpu.value(cpu_after),
                free_memory_mib_after=self.memory.value(mem_after),
                workload=self.workload,
            )
            state = self.base.state_of(class_id)
            found = node_terms(
                state, placement, request, self.base.policy, self.base.fragmentation, resources
            )
        self.terms[memo_key] = found
        return found


class OursCpuPolicy(OursPolicy):
    """ "ours" plus each node's free CPU and memory and the trace's typical workload (see `CpuMemo`)."""

    def __init__(self, context: RunContext, memo: PlacementMemo, cpu_memo: CpuMemo):
        super().__init__(context, memo)
        self.cpu_memo = cpu_memo

    def _keys(self, cluster: SimulatedCluster, pod: TracePod, feasible: IntArray) -> IntArray:
        cpu, memory = self.cpu_memo.cpu, self.cpu_memo.memory
        nc, nm = len(cpu.values), len(memory.values)
        cpu_left = cluster.cpu_left[feasible]
        memory_left = cluster.memory_left[feasible]
        key = self.class_of[feasible] * nc + cpu.index(cpu_left)
        key = key * nc + cpu.index(cpu_left - pod.cpu_milli)
        key = key * nm + memory.index(memory_left)
        return key * nm + memory.index(memory_left - pod.memory_mib)

    def _terms(self, key: int, request: Request) -> RawTerms | None:
        return self.cpu_memo.terms_of(key, request)


def ours_cpu_factory(policy: Policy | None = None) -> Callable[[RunContext], ClusterPolicy]:
    """ "ours+cpu": "ours" told each node's free CPU/memory and the trace's typical workload.

    The extender does not track node CPU yet, so this measures what that would buy. Memos are
    shared across the runs the factory builds, one CPU memo per workload (trace).
    """
    memo = PlacementMemo(policy or extender_default_policy(), default_fragmentation())
    cpu_memos: dict[Workload, CpuMemo] = {}

    def build(context: RunContext) -> ClusterPolicy:
        cpu_memo = cpu_memos.get(context.workload)
        if cpu_memo is None:
            cpu_memo = cpu_memos[context.workload] = CpuMemo(memo, context.workload)
        return OursCpuPolicy(context, memo, cpu_memo)

    return build
