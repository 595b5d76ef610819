"""A port of NVIDIA go-gpuallocator's besteffort policy, for comparison only (topology.md §1.2-1.4).

Scoring: a pair scores the sum of its link entries (PCIe level SYS 10 .. same board 60, plus
100 per NVLink); a set scores the sum over its pairs; a partition the sum over its sets.
`besteffort_allocate` enumerates every partition of the available GPUs into groups of `size`
(padding with `None`), keeps the first best-scoring partition that has a pad-free set holding
all required GPUs, and returns the best such set of it.

Decisions on the sharp edges of topology.md §1.7:
1. a padded set may be returned (the original returns nil devices); callers see the `None`s
   and the benchmark counts such a result as a failed allocation;
3. size 1 takes the first available GPU, as the original does;
4. Go slice aliasing of the stored best partition (≥ 7 sets) is NOT reproduced.
GPUs are fed in index order (the original follows kubelet's unsorted map order).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from itertools import combinations
from math import comb, factorial

from topology.model import LinkKind, NodeTopology

PCIE_LEVEL_SCORE: Mapping[LinkKind, int] = {
    LinkKind.SYS: 10,
    LinkKind.NODE: 20,
    LinkKind.PHB: 30,
    LinkKind.PXB: 40,
    LinkKind.PIX: 50,
    LinkKind.INTERNAL: 60,
}
NVLINK_SCORE = 100
MAX_NVLINKS = 18  # the link enum saturates at 18

Device = int | None  # None is a padding slot
Scores = Sequence[Sequence[int]]


def scores_from_links(
    count: int, pcie: Mapping[tuple[int, int], LinkKind], nvlinks: Mapping[tuple[int, int], int]
) -> list[list[int]]:
    """Pair scores from go-gpuallocator's own link lists (PCIe level and NVLink count per pair)."""
    scores = [[0] * count for _ in range(count)]
    for a, b in combinations(range(count), 2):
        level = pcie.get((a, b))
        score = PCIE_LEVEL_SCORE[level] if level is not None else 0
        score += NVLINK_SCORE * min(nvlinks.get((a, b), 0), MAX_NVLINKS)
        scores[a][b] = scores[b][a] = score
    return scores


def scores_from_topology(topology: NodeTopology) -> list[list[int]]:
    """Pair scores as go-gpuallocator would see the node (topology.md §1.2).

    `topo -m` hides the PCIe level of NVLinked pairs; it is approximated from NUMA affinity
    (same or unknown NUMA -> NODE, else SYS). On NVSwitch boards NVLink is invisible to it.
    """
    pcie: dict[tuple[int, int], LinkKind] = {}
    nvlinks: dict[tuple[int, int], int] = {}
    for link in topology.gpu_links:
        pair = (link.a, link.b)
        if link.kind is LinkKind.NV:
            numa_a, numa_b = topology.gpus[link.a].numa_node, topology.gpus[link.b].numa_node
            pcie[pair] = LinkKind.NODE if numa_a == numa_b else LinkKind.SYS
            if not topology.nvswitch:
                nvlinks[pair] = link.nvlinks
        else:
            pcie[pair] = link.kind
    return scores_from_links(topology.gpu_count, pcie, nvlinks)


def pair_score(scores: Scores, a: Device, b: Device) -> int:
    if a is None or b is None or a == b:
        return 0
    return scores[a][b]


def set_score(scores: Scores, devices: Sequence[Device]) -> int:
    return sum(pair_score(scores, a, b) for a, b in combinations(devices, 2))


def partition_score(scores: Scores, partition: Sequence[Sequence[Device]]) -> int:
    return sum(set_score(scores, s) for s in partition)


def iterate_partitions(devices: Sequence[Device], size: int) -> Iterator[list[list[Device]]]:
    """Every partition of `devices` into sets of `size`, in go-gpuallocator's order."""
    if size <= 0 or size > len(devices):
        return
    if size == 1:
        for d in devices:
            yield [[d]]
        return
    padded: list[Device] = list(devices)
    padding = 0
    while len(padded) % size:
        padded.append(None)
        padding += 1

    def recurse(remaining: list[Device], accum: list[list[Device]]) -> Iterator[list[list[Device]]]:
        if len(remaining) == size:
            yield [*accum, remaining]
            return
        for rest in _first_set_rests(remaining[1:], size - 1, padding):
            chosen = [remaining[0], *rest]
            yield from recurse([d for d in remaining if d not in chosen], [*accum, chosen])

    yield from recurse(padded, [])


def _first_set_rests(pool: list[Device], r: int, padding: int) -> Iterator[list[Device]]:
    """`combinations(pool, r)` in the same order, keeping only those with no pad or every pad.

    The original generates every combination and drops those with some but not all pads;
    pads sit at the end of `pool`, so the survivors can be generated directly.
    """
    pads = sum(1 for d in pool if d is None)
    first_pad = len(pool) - pads

    def extend(start: int, chosen: list[Device]) -> Iterator[list[Device]]:
        need = r - len(chosen)
        if need == 0:
            yield chosen
            return
        for i in range(start, first_pad):
            if first_pad - i < need and not (pads == padding and first_pad - i + pads >= need):
                return
            yield from extend(i + 1, [*chosen, pool[i]])
        if pads and pads == padding and need == pads:
            yield [*chosen, *([None] * pads)]

    yield from extend(0, [])


def partition_count(available: int, size: int) -> int:
    """How many partitions `iterate_partitions` walks (padding slots all sit in one set)."""
    if size <= 0 or size > available:
        return 0
    if size == 1:
        return available
    pads = (-available) % size
    if pads:  # the padded set takes size - pads real devices, the rest splits evenly
        return comb(available, size - pads) * partition_count(available - (size - pads), size)
    groups = available // size
    divisor: int = factorial(size) ** groups * factorial(groups)
    return factorial(available) // divisor


def besteffort_allocate(
    scores: Scores, available: Sequence[int], required: Sequence[int], size: int
) -> list[Device]:
    """go-gpuallocator's `BestEffortPolicy.Allocate` (topology.md §1.4); [] when nothing fits."""
    if size <= 0 or len(available) < size or len(required) > size or len(required) > len(available):
        return []
    wanted = set(required)

    def holds_required(devices: Sequence[Device]) -> bool:
        return wanted <= set(devices)

    best: list[list[Device]] | None = None
    best_score = 0
    for candidate in iterate_partitions(list(available), size):
        if not any(holds_required(s) and None not in s for s in candidate):
            continue
        score = partition_score(scores, candidate)
        if score > best_score or best is None:
            best, best_score = candidate, score
    if best is None:
        return []
    filtered = [s for s in best if holds_required(s)]
    if not filtered:
        return []
    result = filtered[0]
    result_score = set_score(scores, result)
    for s in filtered[1:]:
        score = set_score(scores, s)
        if score > result_score:
            result, result_score = s, score
    return list(result)
