"""Node scoring for prioritize (and for the cluster simulator's "ours" policy).

Each candidate node comes with the placement `place()` found on it. `node_terms` measures the
candidate on its own (cacheable while the node does not change); `combine` turns the terms of
one call's candidates into kube-scheduler's integer priorities 0..10. Three terms, each 0..1
with higher better, are mixed by the policy's weights:

- fragmentation: the FGD fragmentation delta ΔF the placement causes on the node (milli-GPU,
  measured against the typical workload) divided by the GPU capacity the pod takes, so it is
  "stranded GPU per GPU granted": `0.5 - 0.5 * clamp(ΔF / taken, -1, 1)`. 1.0 when the pod
  removes as much fragmentation as it takes (it fills a sliver nothing else could use), 0.5
  when it is neutral, 0.0 when it strands as much as it takes. Absolute, not normalised
  across the candidates: a spread of tiny deltas must not be blown up to the full range.
- packing: how full the node's GPUs are after the placement, 0..1 (binpack and balanced
  prefer fuller nodes, spread emptier ones). This is FGD's own direction: filling up
  partly used nodes keeps whole nodes free for the large requests of the workload.
- link quality:
  - multi-GPU pods: the chosen set's ring bottleneck (then pair total, then what is left
    behind), each relative to the best of the call's candidates (value / best), so the pod
    goes to the best connected set the cluster offers unless packing says otherwise;
  - one GPU or a share: the damage the placement does to the node's own free GPUs: the best
    pair bandwidth the free whole GPUs can still form after it, relative to before it (1.0
    when nothing breaks, or the node had no pair to break; 0.0 when it takes the last pair).
    It protects NVLink pairs without favouring empty nodes, whose pairs never break.

    (Rewarding the *absolute* leftover bandwidth instead sends every small pod to the
    emptiest node, since those keep the best pairs: it spreads pods and wrecks packing.)

`raw = (w_link * link + w_frag * fragmentation + w_pack * packing) / Σw` and the score is
`round(10 * raw)`. The coarse integer buckets are deliberate: near-equal nodes tie and
kube-scheduler (or the simulator's fixed node order) breaks the tie, which acts like first-fit
packing; the paper's FGD plugin gets much of its edge from the same effect, and ranking by
exact deltas does worse (docs/BENCHMARKS.md, "Cluster packing"). Only the multi-GPU link term
depends on the other candidates, and only through their maximum, so scoring a list with
duplicates of a node's state gives that state the same score. Everything is deterministic.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from topology.accounting import with_grants
from topology.gpu_sets import link_table, mask_of
from topology.placement import whole_gpu_candidates
from topology.workload import NodeState, Placement, Policy, PolicyName, Request, WholeGpus

MAX_SCORE = 10
#: How the three link components of a multi-GPU placement mix (the bottleneck dominates).
LINK_MIX = (0.8, 0.15, 0.05)
#: GPU capacity (milli-GPU) assumed taken when a placement's usage does not show it (MIG).
_MIN_TAKEN_MILLI = 1000.0

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
    """One candidate's terms before they are mixed; cacheable while the node does not change.

    `link` is the multi-GPU (bottleneck, pair total, leftover) in GB/s when `link_relative`,
    else the single-GPU damage ratio in its first component. `fragmentation` and `packing`
    are already 0..1.
    """

    node: str
    link: tuple[float, float, float]
    fragmentation_delta: float
    packing: float
    placement: Placement
    fragmentation: float = 0.5
    link_relative: bool = False


def pair_preserved(before: NodeState, placement: Placement) -> float:
    """Best pair bandwidth the free whole GPUs keep after `placement`, relative to before (0..1)."""
    free = whole_gpu_candidates(before)
    if len(free) < 2:
        return 1.0
    table = link_table(before.topology)
    mask = mask_of(free)
    best_before = table.best_ring_within(mask, 2)
    if best_before <= 0:
        return 1.0
    taken = mask_of(placement.gpus) if any(before.usage[i].idle for i in placement.gpus) else 0
    best_after = table.best_ring_within(mask & ~taken, 2)
    return min(1.0, best_after / best_before)


def fragmentation_term(delta_milli: float, taken_milli: float) -> float:
    """0..1, higher is better: 0.5 for a neutral placement (see the module docstring)."""
    ratio = delta_milli / max(taken_milli, 1.0)
    return 0.5 - 0.5 * max(-1.0, min(1.0, ratio))


def node_terms(
    state: NodeState, placement: Placement, request: Request, policy: Policy, fragmentation: Fragmentation
) -> RawTerms:
    """The terms of one candidate; only the multi-GPU link term still needs the other candidates."""
    s = placement.score
    multi = isinstance(request, WholeGpus) and request.count > 1
    if multi:
        link = (s.bottleneck_gbps, s.total_pair_gbps, s.leftover_gbps)
    else:
        link = (pair_preserved(state, placement), 0.0, 0.0)
    after = with_grants(state, placement.grants)
    delta = fragmentation(after) - fragmentation(state)
    util_before, util_after = utilisation(state), utilisation(after)
    taken = (util_after - util_before) * len(state.usage) * 1000.0
    if taken <= 0.0:
        taken = _MIN_TAKEN_MILLI * max(1, len(placement.gpus))
    packing = 1.0 - util_after if policy.name is PolicyName.SPREAD else util_after
    return RawTerms(
        node=state.name,
        link=link,
        fragmentation_delta=delta,
        packing=packing,
        placement=placement,
        fragmentation=fragmentation_term(delta, taken),
        link_relative=multi,
    )


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
    """Mix each candidate's terms by the policy's weights into an integer score 0..10."""
    if not terms:
        return Ranking((), (), (), (), (), ())
    link = _link_terms(terms)
    frag_term = [t.fragmentation for t in terms]
    pack = [t.packing for t in terms]
    total_weight = (policy.weight_link_quality + policy.weight_fragmentation + policy.weight_packing) or 1.0
    wl = policy.weight_link_quality / total_weight
    wf = policy.weight_fragmentation / total_weight
    wp = policy.weight_packing / total_weight
    raw = [wl * a + wf * b + wp * c for a, b, c in zip(link, frag_term, pack, strict=True)]
    scores = [max(0, min(MAX_SCORE, int(r * MAX_SCORE + 0.5))) for r in raw]
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


def _link_terms(terms: Sequence[RawTerms]) -> list[float]:
    """The link term of each candidate: relative to the best candidate for multi-GPU sets."""
    relative = [t.link for t in terms if t.link_relative]
    best = [max(column) for column in zip(*relative, strict=True)] if relative else [0.0, 0.0, 0.0]
    out = []
    for t in terms:
        if not t.link_relative:
            out.append(max(0.0, min(1.0, t.link[0])))
            continue
        parts = [v / b if b > 0 else 1.0 for v, b in zip(t.link, best, strict=True)]
        out.append(sum(w * p for w, p in zip(LINK_MIX, parts, strict=True)))
    return out
