"""Node scoring for prioritize (and for the cluster simulator's "ours" policy).

Each candidate node comes with the placement `place()` found on it. Three terms, each
normalised to 0..1 across the candidates of one call, are mixed by the policy's weights:

- link quality: for multi-GPU pods the bottleneck (then total) bandwidth of the chosen set;
  for every pod, how well connected the free GPUs left behind remain;
- fragmentation: the FGD fragmentation delta the placement causes on the node (lower is
  better), measured against the typical workload;
- packing: how full the node is after the placement (binpack and balanced prefer fuller
  nodes, spread prefers emptier ones).

The result is an integer 0..10 per node, kube-scheduler's extender priority range.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from topology.accounting import with_grants
from topology.workload import NodeState, Placement, Policy, PolicyName, Request, WholeGpus

MAX_SCORE = 10

Fragmentation = Callable[[NodeState], float]


@dataclass(frozen=True, slots=True)
class NodeRanking:
    """One node's priority and the terms it was made of (all 0..1, higher is better)."""

    node: str
    score: int
    raw: float
    link: float
    fragmentation: float
    packing: float
    fragmentation_delta: float
    placement: Placement


def default_fragmentation() -> Fragmentation:
    """The FGD measure against the default typical workload."""
    from topology.fragmentation import node_state_fragmentation

    return node_state_fragmentation


def utilisation(node: NodeState) -> float:
    """Share of the node's GPU capacity allocated, 0..1 (whole GPUs count fully, shares by units)."""
    if not node.usage:
        return 0.0
    total = 0.0
    for gpu, usage in zip(node.topology.gpus, node.usage, strict=True):
        if usage.whole:
            total += 1.0
            continue
        by_units = usage.units_used / node.units_per_gpu if node.units_per_gpu else 0.0
        by_memory = usage.memory_used_mib / gpu.memory_mib if gpu.memory_mib else 0.0
        total += min(1.0, max(by_units, by_memory))
    return total / len(node.usage)


@dataclass(frozen=True, slots=True)
class RawTerms:
    """One candidate's unnormalised terms; cacheable while the node does not change."""

    node: str
    link: tuple[float, float, float]
    fragmentation_delta: float
    packing: float
    placement: Placement


def node_terms(
    state: NodeState, placement: Placement, request: Request, policy: Policy, fragmentation: Fragmentation
) -> RawTerms:
    """The terms of one candidate, before normalisation across the call's candidates."""
    s = placement.score
    multi = isinstance(request, WholeGpus) and request.count > 1
    link = (s.bottleneck_gbps, s.total_pair_gbps, s.leftover_gbps) if multi else (s.leftover_gbps, 0.0, 0.0)
    after = with_grants(state, placement.grants)
    delta = fragmentation(after) - fragmentation(state)
    util = utilisation(after)
    packing = 1.0 - util if policy.name is PolicyName.SPREAD else util
    return RawTerms(state.name, link, delta, packing, placement)


@dataclass(frozen=True, slots=True)
class Ranking:
    """Scores of one prioritize call; `details(node)` explains one node's score on demand."""

    terms: tuple[RawTerms, ...]
    scores: tuple[int, ...]
    raw: tuple[float, ...]
    link: tuple[float, ...]
    fragmentation: tuple[float, ...]
    packing: tuple[float, ...]

    def __iter__(self) -> Iterator[NodeRanking]:
        return (self._at(i) for i in range(len(self.terms)))

    def __len__(self) -> int:
        return len(self.terms)

    def by_node(self) -> dict[str, int]:
        return {t.node: s for t, s in zip(self.terms, self.scores, strict=True)}

    def details(self, node: str) -> NodeRanking | None:
        for i, t in enumerate(self.terms):
            if t.node == node:
                return self._at(i)
        return None

    def _at(self, i: int) -> NodeRanking:
        t = self.terms[i]
        return NodeRanking(
            node=t.node,
            score=self.scores[i],
            raw=self.raw[i],
            link=self.link[i],
            fragmentation=self.fragmentation[i],
            packing=self.packing[i],
            fragmentation_delta=t.fragmentation_delta,
            placement=t.placement,
        )


def combine(terms: Sequence[RawTerms], policy: Policy) -> Ranking:
    """Normalise each term across the candidates and mix them by the policy's weights."""
    if not terms:
        return Ranking((), (), (), (), (), ())
    links = [t.link for t in terms]
    link = _normalise_tuples(links)
    frag_term = _normalise([-t.fragmentation_delta for t in terms])
    pack = _normalise([t.packing for t in terms])
    total_weight = (policy.weight_link_quality + policy.weight_fragmentation + policy.weight_packing) or 1.0
    wl = policy.weight_link_quality / total_weight
    wf = policy.weight_fragmentation / total_weight
    wp = policy.weight_packing / total_weight
    raw = [wl * a + wf * b + wp * c for a, b, c in zip(link, frag_term, pack, strict=True)]
    scores = [int(r * MAX_SCORE + 0.5) for r in raw]
    return Ranking(tuple(terms), tuple(scores), tuple(raw), tuple(link), tuple(frag_term), tuple(pack))


def rank_nodes(
    candidates: Sequence[tuple[NodeState, Placement]],
    request: Request,
    policy: Policy,
    fragmentation: Fragmentation | None = None,
) -> Ranking:
    """Scores for every candidate, in the candidates' order."""
    frag = fragmentation or default_fragmentation()
    return combine([node_terms(s, p, request, policy, frag) for s, p in candidates], policy)


def _normalise(values: Sequence[float]) -> list[float]:
    lo, hi = min(values), max(values)
    if hi - lo < 1e-9:
        return [1.0] * len(values)
    scale = 1.0 / (hi - lo)
    return [(v - lo) * scale for v in values]


def _normalise_tuples(values: Sequence[tuple[float, float, float]]) -> list[float]:
    """Lexicographic quality → 0..1: the first component dominates, the others refine ties."""
    columns = list(zip(*values, strict=True))
    firsts, seconds, thirds = (_normalise(c) for c in columns)
    return [0.8 * a + 0.15 * b + 0.05 * c for a, b, c in zip(firsts, seconds, thirds, strict=True)]
