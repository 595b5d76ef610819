"""Exhaustive oracle for whole-GPU placement: the same objective, by brute force.

Every k-subset of the free GPUs is scored; ring bottlenecks come from every cyclic order
(`itertools.permutations`), leftovers from every subset of what remains. Only the bandwidth
of one pair, the NUMA grouping and the NIC closeness are shared with the fast search; the
search itself is independent. Exponential: meant for tests and the benchmark, on small nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations, permutations

from topology.gpu_sets import SetKey, locality_group, nic_closeness, pair_bandwidth_units
from topology.model import MigMode, NodeTopology
from topology.scheduling import NodeState, WholeGpus


@dataclass(frozen=True, slots=True)
class OracleChoice:
    gpus: tuple[int, ...]
    key: SetKey


def oracle_free_gpus(node: NodeState) -> tuple[int, ...]:
    """GPUs that may be handed out whole: usable, nothing allocated, not in MIG mode."""
    return tuple(
        i
        for i, usage in enumerate(node.usage)
        if usage.usable and usage.idle and node.topology.gpus[i].mig_mode is not MigMode.ENABLED
    )


def oracle_best_set(node: NodeState, request: WholeGpus) -> OracleChoice | None:
    """The best free set for `request` by exhaustive search, or None when none exists."""
    topology = node.topology
    k = request.count
    free = oracle_free_gpus(node)
    if k < 1 or len(free) < k:
        return None
    nic_ranks: tuple[int, ...] | None = None
    if request.near_nic is not None:
        nic_ranks = nic_closeness(topology, request.near_nic)
        if nic_ranks is None:
            return None
    bw = _bandwidth_matrix(topology)
    best: OracleChoice | None = None
    for subset in combinations(free, k):
        key = oracle_key(topology, bw, subset, free, nic_ranks)
        if best is None or key > best.key:  # combinations run in lexicographic order
            best = OracleChoice(subset, key)
    return best


def oracle_key(
    topology: NodeTopology,
    bw: Sequence[Sequence[int]],
    gpus: Sequence[int],
    free: Sequence[int],
    nic_ranks: Sequence[int] | None,
) -> SetKey:
    leftover = [i for i in free if i not in gpus]
    leftover_size = max(len(gpus), 2)
    best_leftover_ring = max(
        (brute_force_ring(bw, subset) for subset in combinations(leftover, leftover_size)), default=0
    )
    groups = {locality_group(topology, i) for i in gpus} - {None}
    return SetKey(
        ring=brute_force_ring(bw, gpus),
        pair_total=sum(bw[a][b] for a, b in combinations(gpus, 2)),
        nic_rank_sum=sum(nic_ranks[i] for i in gpus) if nic_ranks else 0,
        negative_numa_nodes=-len(groups),
        leftover_ring=best_leftover_ring,
        leftover_pairs=sum(max(bw[v][u] for u in leftover if u != v) for v in leftover)
        if len(leftover) > 1
        else 0,
    )


def brute_force_ring(bw: Sequence[Sequence[int]], gpus: Sequence[int]) -> int:
    """The best over every cyclic order of `gpus` of its slowest hop (0 for one GPU)."""
    if len(gpus) < 2:
        return 0
    first, rest = gpus[0], gpus[1:]
    best = 0
    for order in permutations(rest):
        cycle = (first, *order)
        slowest = min(bw[cycle[i]][cycle[(i + 1) % len(cycle)]] for i in range(len(cycle)))
        best = max(best, slowest)
    return best


def _bandwidth_matrix(topology: NodeTopology) -> list[list[int]]:
    n = topology.gpu_count
    return [[pair_bandwidth_units(topology, a, b) if a != b else 0 for b in range(n)] for a in range(n)]
