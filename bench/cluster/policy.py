"""What a scheduling policy is to the simulator, and how node ties are broken.

Two shapes of policy are supported:

- `NodeScorer`: a plain function (node snapshot, pod) -> `NodeChoice | None` (None: the node
  is out). The simulator scores every node that passed the shared filter and takes the
  highest score, ties going to the node priority. This is the easy way to plug in a policy.
- `ClusterPolicy`: `decide(cluster, pod, feasible) -> Decision | None`, which sees every feasible
  node at once; the baselines use it to score all nodes with numpy in one go.

`per_node` turns a `NodeScorer` into a `ClusterPolicy`. Every policy is built per run by a
`PolicyFactory` from a `RunContext` (cluster, node priority, seeded random stream, workload).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from bench.cluster.cluster import Decision, SimulatedCluster
from bench.cluster.frag_table import IntArray
from bench.cluster.trace import TracePod
from topology.fragmentation import Workload


@dataclass(frozen=True, slots=True)
class RunContext:
    cluster: SimulatedCluster
    #: Per node, its rank in the seed's random node order: ties go to the lowest rank (fgd.md §3.1).
    priority: IntArray
    rng: np.random.Generator
    workload: Workload


class ClusterPolicy(Protocol):
    def decide(self, cluster: SimulatedCluster, pod: TracePod, feasible: IntArray) -> Decision | None:
        """Where `pod` goes among the `feasible` nodes (non-empty); None refuses it (the pod fails)."""
        ...


PolicyFactory = Callable[[RunContext], ClusterPolicy]


def pick_best(scores: IntArray | np.ndarray, feasible: IntArray, priority: IntArray) -> int:
    """The feasible node with the highest score; ties go to the lowest priority rank."""
    ranks = priority[feasible]
    best = np.flatnonzero(scores == scores.max())
    return int(feasible[best[np.argmin(ranks[best])]])


# ----------------------------------------------------------------------------- per-node policies


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """One node as a per-node policy sees it (an immutable copy)."""

    index: int
    name: str
    model: str
    gpu_count: int
    cpu_capacity: int
    cpu_left: int
    memory_left: int
    gpu_left: tuple[int, ...]
    fragmentation: float


@dataclass(frozen=True, slots=True)
class NodeChoice:
    score: float
    gpus: tuple[int, ...]


NodeScorer = Callable[[NodeSnapshot, TracePod], NodeChoice | None]


def snapshot(cluster: SimulatedCluster, node: int) -> NodeSnapshot:
    count = int(cluster.gpu_count[node])
    return NodeSnapshot(
        index=node,
        name=cluster.nodes[node].name,
        model=cluster.models[node],
        gpu_count=count,
        cpu_capacity=int(cluster.cpu_capacity[node]),
        cpu_left=int(cluster.cpu_left[node]),
        memory_left=int(cluster.memory_left[node]),
        gpu_left=tuple(int(v) for v in cluster.gpu_left[node, :count]),
        fragmentation=float(cluster.frag.values[node]),
    )


class PerNodePolicy:
    """Adapter: score each feasible node with a `NodeScorer`; snapshots are rebuilt on change."""

    def __init__(self, context: RunContext, scorer: NodeScorer):
        self.priority = context.priority
        self.scorer = scorer
        self._snapshots: list[NodeSnapshot | None] = [None] * context.cluster.size
        self._versions = context.cluster.version.copy()

    def _snapshot(self, cluster: SimulatedCluster, node: int) -> NodeSnapshot:
        cached = self._snapshots[node]
        if cached is None or self._versions[node] != cluster.version[node]:
            cached = snapshot(cluster, node)
            self._snapshots[node] = cached
            self._versions[node] = cluster.version[node]
        return cached

    def decide(self, cluster: SimulatedCluster, pod: TracePod, feasible: IntArray) -> Decision | None:
        best: tuple[float, int, int, tuple[int, ...]] | None = None
        for node in feasible.tolist():
            choice = self.scorer(self._snapshot(cluster, node), pod)
            if choice is None:
                continue
            key = (choice.score, -int(self.priority[node]), node, choice.gpus)
            if best is None or key[:2] > best[:2]:
                best = key
        if best is None:
            return None
        return Decision(best[2], best[3])


def per_node(scorer_factory: Callable[[RunContext], NodeScorer]) -> PolicyFactory:
    """A `PolicyFactory` from a factory of per-node scorers."""

    def build(context: RunContext) -> ClusterPolicy:
        return PerNodePolicy(context, scorer_factory(context))

    return build
