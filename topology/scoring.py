"""Node scoring for prioritize (and for the cluster simulator's "ours" policy).

Each candidate node comes with the placement `place()` found on it. `node_terms` measures the
candidate on its own (cacheable while the node does not change); `combine` turns the terms of
one call's candidates into kube-scheduler's integer priorities 0..10. Three terms, each at
most 1.0 and higher better, are mixed by the policy's weights:

- fragmentation (0..1): sigmoid(-ΔF / 100 milli-GPU), where ΔF is the FGD fragmentation delta
  the placement causes on the node against the typical workload. 0.5 for a neutral
  placement, towards 1 when the pod fills capacity nothing else could use, towards 0 when it
  strands some. Absolute, not normalised across the candidates: a spread of tiny deltas must
  not be blown up to the full range.
- packing (0.9..1.0): how full the node's GPUs are after the placement (binpack and balanced
  prefer fuller nodes, spread emptier ones). FGD's direction, but only a tie-breaker: a
  strong best-fit term sends pods to nodes whose CPU then runs out first and strands GPUs.
- link quality (0.75..1.0):
  - multi-GPU pods: the chosen set's ring bottleneck (then pair total, then what it leaves
    behind), each relative to the best candidate of the call (value / best);
  - one GPU or a share: the damage the placement does to the node's own free GPUs: the
    pairing value of the free whole GPUs (the largest total bandwidth of disjoint pairs)
    lost, relative to the node's best free pair. Taking the odd one out costs nothing,
    breaking an NVLink pair costs the pair. An empty node and a node with one pair left lose
    the same, so the term never favours empty nodes. (Rewarding the *absolute* leftover
    bandwidth, or its ratio before/after, sends small pods to the emptiest nodes and wrecks
    packing: 9-11% unallocated on the openb trace instead of 5-6%.)

The packing and link terms are squeezed below 1.0 (`PACKING_SPREAD`, `LINK_SPREAD`) so that
under equal weights the fragmentation term decides between clearly different placements
and the others separate near-equal ones.

`raw = (w_link * link + w_frag * fragmentation + w_pack * packing) / Σw` and the score is
`round(10 * raw)`. The coarse integer buckets are deliberate: near-equal nodes tie and
kube-scheduler (or the simulator's fixed node order) breaks the tie, which acts like first-fit
packing; the paper's FGD plugin gets much of its edge from the same effect, and ranking by
exact deltas does worse (docs/BENCHMARKS.md, "Cluster packing"). Only the multi-GPU link term
depends on the other candidates, and only through their maximum, so scoring a list with
duplicates of a node's state gives that state the same score. Everything is deterministic.

The fragmentation delta is FGD's measure against a typical workload. By default it sees GPUs
only, against `topology.fragmentation.DEFAULT_WORKLOAD`; a caller that knows the node's free
CPU and memory before and after the pod and a workload with CPU shapes (the extender: from its
node and pod watches and `topology.workload_learning`) passes them as `NodeResourcesContext`,
and the delta then counts idle GPUs left on a node too short of CPU or memory for the typical
pods. With the node's CPU capacity it also gives how much the pod moves the node's CPU and
GPUs apart (`RawTerms.imbalance`) and how far its CPU falls short of its free GPUs after the pod
(`RawTerms.cpu_short`), which `topology.node_choice` ranks by when the extender decides the
node itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from topology.accounting import with_grants
from topology.fragmentation import Workload, node_state_fragmentation
from topology.gpu_sets import LinkTable, link_table, mask_of, members_of
from topology.placement import whole_gpu_candidates
from topology.scheduling import NodeState, Placement, Policy, PolicyName, Request, WholeGpus

MAX_SCORE = 10
#: How the three link components of a multi-GPU placement mix (the bottleneck dominates).
LINK_MIX = (0.8, 0.15, 0.05)
#: ΔF (milli-GPU) that moves the fragmentation term from 0.5 to sigmoid(-1) = 0.27.
FRAGMENTATION_SCALE_MILLI = 100.0
#: How far the packing term spreads below 1.0 (an empty node gets 1 - PACKING_SPREAD).
PACKING_SPREAD = 0.1
#: How far the link term spreads below 1.0 (the worst link gets 1 - LINK_SPREAD).
LINK_SPREAD = 0.25

Fragmentation = Callable[[NodeState], float]


@dataclass(frozen=True, slots=True)
class NodeResourcesContext:
    """A node's free CPU and memory before and after the pod, and the typical workload to measure against.

    With it, `node_terms` measures fragmentation with
    `topology.fragmentation.node_state_fragmentation(state, workload, cpu, memory)` before and
    after the placement instead of the GPU-only `fragmentation` callable. `None` CPU or memory
    means unconstrained. `cpu_capacity_milli` (the node's allocatable CPU, optional) gives the
    change in the CPU/GPU balance the pod makes (`imbalance_change`).
    """

    free_cpu_milli_before: int | None
    free_memory_mib_before: int | None
    free_cpu_milli_after: int | None
    free_memory_mib_after: int | None
    workload: Workload
    cpu_capacity_milli: int | None = None


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
    imbalance: float = 0.0  # the pod's change of |free CPU share - free GPU share| (0: CPU unknown)
    cpu_short: float = 0.0  # free GPU share - free CPU share after the pod, if positive (0: CPU unknown)


def pair_preserved(before: NodeState, placement: Placement) -> float:
    """1.0 minus the pairing bandwidth the placement breaks among the node's free whole GPUs.

    The free GPUs' pairing value is the largest total bandwidth of disjoint GPU pairs (a
    maximum-weight matching). Taking a GPU that nothing needed as a partner (an odd one out)
    costs nothing; taking one out of a pair costs that pair, relative to the node's best pair.
    An empty node and a node with exactly one pair left lose the same, so emptier nodes are
    not preferred.
    """
    free = whole_gpu_candidates(before)
    taken = mask_of([i for i in placement.gpus if i in free])
    if len(free) < 2 or not taken:
        return 1.0
    table = link_table(before.topology)
    mask = mask_of(free)
    best_pair = table.best_ring_within(mask, 2)
    if best_pair <= 0:
        return 1.0
    lost = _pairing(table, mask) - _pairing(table, mask & ~taken)
    return max(0.0, 1.0 - lost / best_pair)


_PAIRINGS: dict[tuple[LinkTable, int], int] = {}


def _pairing(table: LinkTable, mask: int) -> int:
    """Largest total bandwidth of disjoint pairs among the GPUs of `mask` (memoised)."""
    key = (table, mask)
    found = _PAIRINGS.get(key)
    if found is not None:
        return found
    if mask & (mask - 1) == 0:
        found = 0
    else:
        low = (mask & -mask).bit_length() - 1
        rest = mask & ~(1 << low)
        found = _pairing(table, rest)
        bw = table.bandwidth[low]
        for other in members_of(rest):
            found = max(found, bw[other] + _pairing(table, rest & ~(1 << other)))
    if len(_PAIRINGS) >= 100_000:
        _PAIRINGS.clear()
    _PAIRINGS[key] = found
    return found


def fragmentation_term(delta_milli: float) -> float:
    """0..1, higher is better: sigmoid(-ΔF / 100 milli-GPU); 0.5 for a neutral placement."""
    x = max(-50.0, min(50.0, delta_milli / FRAGMENTATION_SCALE_MILLI))
    return 1.0 / (1.0 + math.exp(x))


def packing_term(util_before: float, util_after: float, policy: Policy) -> float:
    """1 - PACKING_SPREAD .. 1, higher is better: fuller after the placement (emptier under spread)."""
    fullness = 1.0 - util_after if policy.spread or policy.name == PolicyName.SPREAD.value else util_after
    return 1.0 - PACKING_SPREAD + PACKING_SPREAD * fullness


#: The free CPU share is counted in whole percent, so equal bands give equal terms.
CPU_SHARE_STEPS = 100


def free_cpu_share(free_cpu_milli: int, cpu_capacity_milli: int) -> float:
    """A node's free CPU as a share of its capacity (positive), rounded down to whole percent, so
    equal bands give equal terms."""
    steps = max(0, min(CPU_SHARE_STEPS, CPU_SHARE_STEPS * free_cpu_milli // cpu_capacity_milli))
    return steps / CPU_SHARE_STEPS


def cpu_gpu_imbalance(free_cpu_milli: int, cpu_capacity_milli: int, gpu_utilisation: float) -> float:
    """|free CPU share - free GPU share| of a node: 0 when both run out together.

    The free CPU share is rounded down to whole percent (`free_cpu_share`)."""
    if cpu_capacity_milli <= 0:
        return 0.0
    return abs(free_cpu_share(free_cpu_milli, cpu_capacity_milli) - (1.0 - gpu_utilisation))


def cpu_shortfall(free_cpu_milli: int, cpu_capacity_milli: int, gpu_utilisation: float) -> float:
    """How far a node's free CPU share falls short of its free GPU share (0 when it does not).

    One-sided: GPUs left free beside too little CPU may go unused, CPU left beside used-up GPUs
    costs no GPU. The free CPU share is rounded down to whole percent (`free_cpu_share`)."""
    if cpu_capacity_milli <= 0:
        return 0.0
    return max(0.0, (1.0 - gpu_utilisation) - free_cpu_share(free_cpu_milli, cpu_capacity_milli))


def imbalance_change(
    free_cpu_milli_before: int,
    free_cpu_milli_after: int,
    cpu_capacity_milli: int,
    gpu_utilisation_before: float,
    gpu_utilisation_after: float,
) -> float:
    """How much the pod moves the node's CPU and GPUs apart (negative: closer together).

    The change, not the state after: a GPU pod asking for little CPU moves every node with CPU to
    spare apart by the same amount, so such nodes tie and fill one after another (packing); ranked
    by the state after, the emptiest node always looked best, which spread such pods over every
    node and left no room for whole-node jobs."""
    after = cpu_gpu_imbalance(free_cpu_milli_after, cpu_capacity_milli, gpu_utilisation_after)
    before = cpu_gpu_imbalance(free_cpu_milli_before, cpu_capacity_milli, gpu_utilisation_before)
    return after - before


def node_terms(
    state: NodeState,
    placement: Placement,
    request: Request,
    policy: Policy,
    fragmentation: Fragmentation,
    resources: NodeResourcesContext | None = None,
) -> RawTerms:
    """The terms of one candidate; only the multi-GPU link term still needs the other candidates.

    `resources` (optional) gives the node's free CPU and memory before and after the pod and a
    typical workload; the fragmentation delta then counts CPU and memory against that workload
    and `fragmentation` is not used; with the node's CPU capacity it also gives `imbalance` and
    `cpu_short`.
    """
    s = placement.score
    multi = isinstance(request, WholeGpus) and request.count > 1
    if multi:
        link = (s.bottleneck_gbps, s.total_pair_gbps, s.leftover_gbps)
    else:
        link = (pair_preserved(state, placement), 0.0, 0.0)
    after = with_grants(state, placement.grants)
    if resources is None:
        delta = fragmentation(after) - fragmentation(state)
    else:
        r = resources
        delta = node_state_fragmentation(
            after, r.workload, r.free_cpu_milli_after, r.free_memory_mib_after
        ) - node_state_fragmentation(state, r.workload, r.free_cpu_milli_before, r.free_memory_mib_before)
    util_before, util_after = utilisation(state), utilisation(after)
    packing = packing_term(util_before, util_after, policy)
    imbalance = cpu_short = 0.0
    if (
        resources is not None
        and resources.cpu_capacity_milli
        and resources.free_cpu_milli_after is not None
        and resources.free_cpu_milli_before is not None
    ):
        imbalance = imbalance_change(
            resources.free_cpu_milli_before,
            resources.free_cpu_milli_after,
            resources.cpu_capacity_milli,
            util_before,
            util_after,
        )
        cpu_short = cpu_shortfall(resources.free_cpu_milli_after, resources.cpu_capacity_milli, util_after)
    return RawTerms(
        node=state.name,
        link=link,
        fragmentation_delta=delta,
        packing=packing,
        placement=placement,
        fragmentation=fragmentation_term(delta),
        link_relative=multi,
        imbalance=imbalance,
        cpu_short=cpu_short,
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
        if t.link_relative:
            parts = [v / b if b > 0 else 1.0 for v, b in zip(t.link, best, strict=True)]
            quality = sum(w * p for w, p in zip(LINK_MIX, parts, strict=True))
        else:
            quality = max(0.0, min(1.0, t.link[0]))
        out.append(1.0 - LINK_SPREAD + LINK_SPREAD * quality)
    return out
