"""The node a pod should go to, when the extender decides it (a policy's `decideNode`).

kube-scheduler's extender priorities are integers 0..10, multiplied by the extender's weight,
added to the in-tree plugins' scores, ties broken at random: too coarse, and too mixed, to
carry a packing decision. When a policy lets it, the extender's filter answers only the node
this module chooses, and the scheduler binds there.

The ranking (`decision_key`, lowest wins), from the candidates' `topology.scoring.RawTerms`:

1. the FGD fragmentation delta in steps of `FRAGMENTATION_STEP_MILLI` (rounded down): the pod
   goes where the typical workload loses least usable GPU. The step is deliberately coarse:
   ranking by the exact delta chases noise (one seed of the openb trace leaves 7.4% of GPUs
   unallocated that way, against 4.9% in steps), and the tie-breaks below carry the rest;
2. how much the pod moves the node's free CPU share and free GPU share apart
   (`RawTerms.imbalance`, the change of |free CPU share - free GPU share|, negative when it
   brings them together) in `BALANCE_LEVELS` bands (`MULTI_GPU_BALANCE_LEVELS` for a pod of
   several whole GPUs): among equally fragmenting nodes, the one where CPU and GPUs come closer
   to running out together, so neither is left idle beside an exhausted other. The change, not
   the state after: nodes with CPU to spare all change alike for a pod asking for little CPU,
   so they tie and fill in name order instead of the emptiest winning every time (which spread
   such pods over every node). The bands are coarse (thirds of the range) so that the next
   term decides more often; a multi-GPU pod moves the balance by several GPUs' worth at once
   and is ranked in finer bands (in thirds, the openb trace with half of its pods multi-GPU
   leaves 3.5% of GPUs unallocated instead of 2.9%);
3. how far the node's free CPU share falls short of its free GPU share after the pod
   (`RawTerms.cpu_short`, 0 when it does not) in `CPU_SHORT_LEVELS` bands: among nodes the
   pod moves alike, the one that is left with fewer GPUs stranded beside too little CPU.
   One-sided on purpose: a node left with CPU to spare beside used GPUs is not penalised, so an
   empty node never outranks a partly used one on this term either and identical pods still
   fill one node after another;
4. for a multi-GPU pod, the ring bottleneck of the set `place` found on the node relative to
   the best candidate's, in `LINK_LEVELS` bands (higher first);
5. a fixed pseudo-random order of node names (CRC-32 of the name): equal nodes are filled
   one after another instead of at random, which packs (first fit over a random order), and
   any two processes rank the same nodes the same way.

Measured on the openb traces (docs/BENCHMARKS.md, "Cluster packing"), steps 2-3 as above
leave fewer GPUs unallocated than FGD on the default, share-heavy and multi-GPU traces; the
balance in five bands without step 3 left more than FGD.

Everything is a pure function of the terms and the names.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from topology.scoring import RawTerms

FRAGMENTATION_STEP_MILLI = 80.0
BALANCE_LEVELS = 3
MULTI_GPU_BALANCE_LEVELS = 5
CPU_SHORT_LEVELS = 5
LINK_LEVELS = 10

TermsRank = tuple[int, int, int, int]
DecisionKey = tuple[int, int, int, int, int, str]


def name_rank(name: str) -> int:
    """The node's place in the fixed tie-break order (CRC-32 of its name)."""
    return zlib.crc32(name.encode())


def rank_terms(terms: RawTerms, best_bottleneck: float = 0.0) -> TermsRank:
    """Steps 1-4 of the ranking (lower first), from the terms alone; `best_bottleneck` is the
    best multi-GPU ring bottleneck among the candidates (0: not a multi-GPU pod)."""
    frag_step = math.floor(round(terms.fragmentation_delta, 6) / FRAGMENTATION_STEP_MILLI)
    levels = MULTI_GPU_BALANCE_LEVELS if terms.link_relative else BALANCE_LEVELS
    balance = max(-levels, min(levels, math.floor(round(terms.imbalance, 9) * levels)))
    short = max(0, min(CPU_SHORT_LEVELS, math.floor(round(terms.cpu_short, 9) * CPU_SHORT_LEVELS)))
    link = 0
    if terms.link_relative and best_bottleneck > 0:
        link = -math.floor(LINK_LEVELS * min(1.0, terms.link[0] / best_bottleneck) + 1e-9)
    return (frag_step, balance, short, link)


def decision_key(terms: RawTerms, best_bottleneck: float = 0.0) -> DecisionKey:
    """How `terms`' node ranks as the pod's node (lower first): `rank_terms`, then the node's
    `name_rank`, then its name."""
    return (*rank_terms(terms, best_bottleneck), name_rank(terms.node), terms.node)


def best_bottleneck(candidates: Sequence[RawTerms]) -> float:
    """The best multi-GPU ring bottleneck among the candidates (0.0 for single-GPU requests)."""
    return max((t.link[0] for t in candidates if t.link_relative), default=0.0)


def choose_node(candidates: Sequence[RawTerms]) -> RawTerms | None:
    """The candidate the pod should go to (None when there is none)."""
    if not candidates:
        return None
    best = best_bottleneck(candidates)
    return min(candidates, key=lambda t: decision_key(t, best))


#: What each place of a `DecisionKey` ranks by, for saying why one node beat another.
DECISION_STEPS = (
    "fragmentation",
    "CPU/GPU balance",
    "CPU shortfall",
    "ring bottleneck",
    "name order",
    "name order",
)


@dataclass(frozen=True, slots=True)
class NodeChoice:
    """The node chosen, the one ranked next (None when it was the only candidate), and the first
    step of the ranking that told them apart (`DECISION_STEPS`; "" without a runner-up)."""

    chosen: RawTerms
    runner_up: RawTerms | None = None
    decided_by: str = ""


def decided_by(first: DecisionKey, second: DecisionKey) -> str:
    """The step of the ranking (`DECISION_STEPS`) at which two nodes' decision keys part."""
    step = next((i for i, (a, b) in enumerate(zip(first, second, strict=True)) if a != b), len(first) - 1)
    return DECISION_STEPS[step]


def explain_choice(chosen: RawTerms, runner_up: RawTerms | None, best_bottleneck: float) -> NodeChoice:
    """`NodeChoice` for two candidates ranked against the same best ring bottleneck."""
    if runner_up is None:
        return NodeChoice(chosen)
    step = decided_by(decision_key(chosen, best_bottleneck), decision_key(runner_up, best_bottleneck))
    return NodeChoice(chosen, runner_up, step)


def ranked_choice(candidates: Sequence[RawTerms]) -> NodeChoice | None:
    """`choose_node`'s choice with the runner-up and why it lost (None without candidates)."""
    if not candidates:
        return None
    best = best_bottleneck(candidates)
    first, *rest = sorted(candidates, key=lambda t: decision_key(t, best))
    return explain_choice(first, rest[0] if rest else None, best)
