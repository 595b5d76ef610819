"""Linkpack's own policy in the simulator ("ours"), through the very functions the extender uses.

Every openb node gets a topology (`bench.cluster.topologies`) and a `topology.workload.NodeState`
(shares in units of 1/1000 GPU, so trace shares map exactly; whole-held GPUs marked whole).
For each feasible node `topology.placement.place` chooses the GPUs, as the extender's filter
does. Then the node is scored:

- when `topology.scoring.score_node(node, placement, request, policy) -> float` exists (higher
  is better), by that hook; the lead wires the extender's default scoring in there;
- otherwise by an FGD-like rule: the FGD plugin's integer score of the fragmentation delta the
  placement causes under the trace's target workload (with CPU, as FGD), then for multi-GPU
  pods the ring bottleneck of the chosen set, then the node priority.

CPU-only pods are ranked the same way (their delta only comes from the CPU they take).

Why so little beyond FGD at node level (default trace, seeds 42-43, unallocated % at 100%
arrival; FGD itself 4.6-4.7): ranking by the exact delta (rounded to 0.1 milli-GPU), then by
fullness, gave 6.7; ranking equal FGD scores by the best pair the leftover free GPUs can still
form gave 9.5, because the emptiest nodes always keep the best pairs, so it spreads pods;
sending CPU-only pods to the node with the least CPU left gave 5.1-5.4; this rule gives
4.7-4.8. Coarse score buckets plus the seed's fixed node order act as first-fit packing among
near-equal nodes. Topology matters inside the node (which GPUs `place` picks), not in which
node is chosen.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from bench.cluster.cluster import ClusterState, Decision
from bench.cluster.fgd_policy import sigmoid_scores
from bench.cluster.frag_table import IntArray
from bench.cluster.policy import ClusterPolicy, RunContext, pick_best
from bench.cluster.topologies import topology_for
from bench.cluster.trace import MILLI_PER_GPU, TracePod
from topology.model import NodeTopology
from topology.workload import GpuShare, GpuUsage, NodeState, Placement, Policy, Request, WholeGpus

UsageKey = tuple[int, ...]  # free milli per GPU, -1 for a GPU held whole
ScoreHook = Callable[[NodeState, Placement, Request, Policy], float]


@dataclass(frozen=True, slots=True)
class Choice:
    gpus: tuple[int, ...]
    link_gbps: float
    placement: Placement


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


def score_hook() -> ScoreHook | None:
    """`topology.scoring.score_node` when the module defines it."""
    try:
        scoring = importlib.import_module("topology.scoring")
    except ImportError:
        return None
    hook = getattr(scoring, "score_node", None)
    return hook if callable(hook) else None


def place_function() -> Callable[[NodeState, Request, Policy], object] | None:
    try:
        placement = importlib.import_module("topology.placement")
    except ImportError:
        return None
    place = getattr(placement, "place", None)
    return place if callable(place) else None


class OursPolicy:
    """Nodes with the same topology and usage form a class; `place` runs once per class and request."""

    def __init__(self, context: RunContext, policy: Policy, memo: PlacementMemo):
        cluster = context.cluster
        self.priority = context.priority
        self.policy = policy
        self.hook = score_hook()
        self.place = place_function()
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

    def _choice(self, class_id: int, request: Request) -> Choice | None:
        key = (class_id, request)
        if key in self.memo.placements:
            return self.memo.placements[key]
        state = self.memo.state_of(class_id)
        choice = None
        if self.place is not None:
            outcome = self.place(state, request, self.policy)
            if isinstance(outcome, Placement):
                multi = isinstance(request, WholeGpus) and request.count > 1
                link = outcome.score.bottleneck_gbps if multi else outcome.score.leftover_gbps
                choice = Choice(outcome.gpus, link, outcome)
        self.memo.placements[key] = choice
        return choice

    def decide(self, cluster: ClusterState, pod: TracePod, feasible: IntArray) -> Decision | None:
        request = request_for(pod)
        if request is None:
            return self._decide_cpu_only(cluster, pod, feasible)
        self._refresh_classes(cluster)
        classes, inverse = np.unique(self.class_of[feasible], return_inverse=True)
        choices = [self._choice(c, request) for c in classes.tolist()]
        placeable = np.array([c is not None for c in choices])[inverse]
        if not placeable.any():
            return None
        nodes = feasible[placeable]
        node_choice = inverse[placeable]
        if self.hook is not None:
            class_scores = np.array(
                [
                    -np.inf
                    if c is None
                    else self.hook(self.memo.state_of(k), c.placement, request, self.policy)
                    for k, c in zip(classes.tolist(), choices, strict=True)
                ]
            )
            best = pick_best(class_scores[node_choice], nodes, self.priority)
        else:
            best = self._fgd_like_best(cluster, pod, nodes, node_choice, choices)
        chosen = choices[int(inverse[np.flatnonzero(feasible == best)[0]])]
        assert chosen is not None
        return Decision(best, chosen.gpus)

    def _fgd_like_best(
        self,
        cluster: ClusterState,
        pod: TracePod,
        nodes: IntArray,
        node_choice: IntArray,
        choices: list[Choice | None],
    ) -> int:
        first_gpu = np.array([c.gpus[0] if c is not None and c.gpus else 0 for c in choices])[node_choice]
        free_before = cluster.gpu_left[nodes, first_gpu] if pod.is_fractional else None
        delta = cluster.fragmentation_after(nodes, pod, free_before) - cluster.frag.values[nodes]
        if pod.gpu_count > 1:
            link = np.array([c.link_gbps if c is not None else 0.0 for c in choices])[node_choice]
        else:
            link = np.zeros(len(nodes))
        return _lexicographic_best(nodes, sigmoid_scores(-delta), link, self.priority)

    def _decide_cpu_only(self, cluster: ClusterState, pod: TracePod, feasible: IntArray) -> Decision:
        delta = cluster.fragmentation_after(feasible, pod, None) - cluster.frag.values[feasible]
        best = _lexicographic_best(feasible, sigmoid_scores(-delta), np.zeros(len(feasible)), self.priority)
        return Decision(best, ())


class PlacementMemo:
    """Node classes (topology kind + usage) and `place` results, shared by the runs of one process."""

    def __init__(self) -> None:
        self.classes: dict[tuple[tuple[str, int], UsageKey], int] = {}
        self.keys: list[tuple[tuple[str, int], UsageKey]] = []
        self.states: dict[int, NodeState] = {}
        self.placements: dict[tuple[int, Request], Choice | None] = {}

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
            state = node_state("node", topology_for(model, count), usage)
            self.states[class_id] = state
        return state


def _lexicographic_best(nodes: IntArray, first: np.ndarray, second: np.ndarray, priority: IntArray) -> int:
    """The node with the largest (first, second), ties to the lowest priority rank."""
    order = np.lexsort((priority[nodes], -second, -first))
    return int(nodes[order[0]])


def ours_factory(policy: Policy | None = None) -> Callable[[RunContext], ClusterPolicy]:
    """ "ours" with the extender's default policy; placements are shared across the runs it builds."""
    memo = PlacementMemo()
    chosen = policy or Policy()

    def build(context: RunContext) -> ClusterPolicy:
        return OursPolicy(context, chosen, memo)

    return build
