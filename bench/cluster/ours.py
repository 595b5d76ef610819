"""Linkpack's own policy in the simulator ("ours"): the extender's filter, prioritize and placement.

Every openb node gets a topology (`bench.cluster.topologies`) and a `topology.workload.NodeState`
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

CPU-only pods never reach the extender (it manages GPU resources only, and answers score 0
for everything else), so they go to the first feasible node in the fixed order.

Speed: nodes with the same topology and usage give the same `place` result and terms, so they
form a class; `place` and `node_terms` run once per (class, request), the way the extender
memoises them per node version, and `combine` scores one representative per class. That is
exact because `combine` scores each candidate on its own terms plus, for multi-GPU sets, the
best candidate's link values, which duplicates do not change (tests/bench checks it).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from bench.cluster.cluster import ClusterState, Decision
from bench.cluster.frag_table import IntArray
from bench.cluster.policy import ClusterPolicy, RunContext, pick_best
from bench.cluster.topologies import topology_for
from bench.cluster.trace import MILLI_PER_GPU, TracePod
from extender.config import ExtenderConfig
from topology.model import NodeTopology
from topology.placement import place
from topology.scoring import Fragmentation, RawTerms, combine, default_fragmentation, node_terms
from topology.workload import GpuShare, GpuUsage, NodeState, Placement, Policy, Request, WholeGpus

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

    def terms_of(self, class_id: int, request: Request) -> RawTerms | None:
        """`place` (filter) then `node_terms` (prioritize) for one class; None when it does not fit."""
        key = (class_id, request)
        if key in self.terms:
            return self.terms[key]
        state = self.state_of(class_id)
        outcome = place(state, request, self.policy)
        found = None
        if isinstance(outcome, Placement):
            found = node_terms(state, outcome, request, self.policy, self.fragmentation)
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

    def _class_id(self, cluster: ClusterState, node: int) -> int:
        count = int(cluster.gpu_count[node])
        row = cluster.gpu_left[node, :count].tolist()
        held = cluster.whole_held[node, :count].tolist()
        usage = tuple(-1 if h else int(v) for v, h in zip(row, held, strict=True))
        return self.memo.class_id(self.kinds[node], usage)

    def _refresh_classes(self, cluster: ClusterState) -> None:
        changed = np.flatnonzero(cluster.version != self._versions)
        for node in changed.tolist():
            self.class_of[node] = self._class_id(cluster, node)
        self._versions[changed] = cluster.version[changed]

    def decide(self, cluster: ClusterState, pod: TracePod, feasible: IntArray) -> Decision | None:
        request = request_for(pod)
        if request is None:
            return Decision(pick_best(np.zeros(len(feasible)), feasible, self.priority), ())
        self._refresh_classes(cluster)
        classes, inverse = np.unique(self.class_of[feasible], return_inverse=True)
        terms = [self.memo.terms_of(c, request) for c in classes.tolist()]
        fitting = [i for i, t in enumerate(terms) if t is not None]
        if not fitting:
            return None
        ranking = combine([t for t in terms if t is not None], self.memo.policy)
        class_scores = np.full(len(classes), -1, dtype=np.int64)
        class_scores[fitting] = ranking.scores
        best = pick_best(class_scores[inverse], feasible, self.priority)
        chosen = terms[int(inverse[np.flatnonzero(feasible == best)[0]])]
        assert chosen is not None
        return Decision(best, chosen.placement.gpus)


def ours_factory(policy: Policy | None = None) -> Callable[[RunContext], ClusterPolicy]:
    """ "ours" with the extender's default policy; terms are shared across the runs it builds."""
    memo = PlacementMemo(policy or extender_default_policy(), default_fragmentation())

    def build(context: RunContext) -> ClusterPolicy:
        return OursPolicy(context, memo)

    return build
