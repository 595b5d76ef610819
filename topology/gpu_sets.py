"""How good a set of GPUs is, and the search for the best set of a given size.

The quality of a set is compared lexicographically, highest first:

1. `ring` — the bottleneck of the best ring through the set: the largest `t` such that the
   links of at least `t` admit a Hamiltonian cycle over the set (the pair link for two GPUs,
   0 for one). Ring all-reduce runs at the speed of its slowest hop.
2. `pair_total` — the sum of the bandwidth of every pair in the set.
3. locality — closeness to the requested NIC (sum of PCIe closeness ranks), then fewer
   NUMA nodes (GPUs without a NUMA id are grouped by CPU affinity when it is known).
4. leftovers — among the free GPUs the choice leaves behind: the best ring a set of the same
   size (at least two) can still form, then how well every leftover GPU can still pair
   (the sum over leftover GPUs of their best link to another leftover GPU).
5. the lexicographically smallest tuple of GPU indices.

Bandwidth is held as integers (`BANDWIDTH_SCALE` units per GB/s) so that sums are exact and
every search order agrees with `topology.oracle`. Per-topology tables are built once and
cached; ring bottlenecks are memoised per GPU bitmask.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from itertools import combinations

from topology.bandwidth import link_bandwidth
from topology.model import NodeTopology

#: Integer bandwidth units per GB/s (`link_bandwidth` rounds to four decimals).
BANDWIDTH_SCALE = 10_000
#: Nodes up to this many GPUs get the ring bottleneck of every GPU subset precomputed.
PRECOMPUTE_MAX_GPUS = 10
#: Memo tables are emptied when they grow past this many entries (bounds memory on 16-GPU nodes).
MEMO_LIMIT = 200_000


def pair_bandwidth_units(topology: NodeTopology, a: int, b: int) -> int:
    """Bandwidth between two GPUs in integer units; the slower model wins; 0 when unknown."""
    try:
        link = topology.link(a, b)
    except KeyError:
        return 0
    models = {topology.gpus[a].model, topology.gpus[b].model}
    gbps = min(link_bandwidth(link.kind, link.nvlinks, model) for model in models)
    return round(gbps * BANDWIDTH_SCALE)


def locality_group(topology: NodeTopology, index: int) -> str | None:
    """The NUMA node a GPU sits on ("numa:N"), else its CPU affinity ("cpus:…"), else None."""
    gpu = topology.gpus[index]
    if gpu.numa_node is not None:
        return f"numa:{gpu.numa_node}"
    if gpu.cpu_affinity:
        return f"cpus:{gpu.cpu_affinity}"
    return None


def nic_closeness(topology: NodeTopology, nic_name: str) -> tuple[int, ...] | None:
    """Per GPU, how close it sits to the NIC (`LinkKind.pcie_rank`, 0 = farthest or unknown).

    The NIC is named by its device name ("mlx5_0") or its `topo -m` alias ("NIC0"); None when
    the node has no such NIC.
    """
    nic = next((n for n in topology.nics if nic_name in (n.name, f"NIC{n.index}")), None)
    if nic is None:
        return None
    ranks = [0] * topology.gpu_count
    for link in topology.nic_links:
        if link.nic == nic.index and 0 <= link.gpu < topology.gpu_count:
            ranks[link.gpu] = link.kind.pcie_rank
    return tuple(ranks)


def members_of(mask: int) -> tuple[int, ...]:
    """The GPU indices set in a bitmask, ascending."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return tuple(out)


def mask_of(indices: Sequence[int]) -> int:
    mask = 0
    for i in indices:
        mask |= 1 << i
    return mask


@dataclass(frozen=True, slots=True, order=True)
class SetKey:
    """The comparable quality of one candidate set (higher is better, field by field)."""

    ring: int
    pair_total: int
    nic_rank_sum: int
    negative_numa_nodes: int
    leftover_ring: int
    leftover_pairs: int


@dataclass(frozen=True, eq=False)
class LinkTable:
    """Everything the set search needs about one topology, plus memo tables."""

    topology: NodeTopology
    bandwidth: tuple[tuple[int, ...], ...]
    groups: tuple[str | None, ...]
    twin_of: tuple[int, ...]  # the smallest GPU interchangeable with each GPU
    _rings: dict[int, int] = field(default_factory=dict, repr=False)
    _pair_totals: dict[int, int] = field(default_factory=dict, repr=False)
    _best_rings: dict[tuple[int, int], int] = field(default_factory=dict, repr=False)

    @property
    def size(self) -> int:
        return len(self.bandwidth)

    # ------------------------------------------------------------------ single-set terms

    def ring_bottleneck(self, mask: int) -> int:
        """Bottleneck of the best ring (Hamiltonian cycle) through the GPUs in `mask`."""
        cached = self._rings.get(mask)
        if cached is None:
            cached = self._compute_ring(members_of(mask))
            if len(self._rings) >= MEMO_LIMIT:
                self._rings.clear()
            self._rings[mask] = cached
        return cached

    def pair_total(self, members: Sequence[int]) -> int:
        """Sum of the bandwidth of every pair among `members`."""
        bw = self.bandwidth
        return sum(bw[a][b] for a, b in combinations(members, 2))

    def pair_total_of_mask(self, mask: int) -> int:
        cached = self._pair_totals.get(mask)
        if cached is None:
            cached = self.pair_total(members_of(mask))
            if len(self._pair_totals) >= MEMO_LIMIT:
                self._pair_totals.clear()
            self._pair_totals[mask] = cached
        return cached

    def numa_nodes(self, members: Sequence[int]) -> int:
        return len({self.groups[i] for i in members if self.groups[i] is not None})

    def leftover_pairs(self, members: Sequence[int]) -> int:
        """Sum over `members` of each one's best link to another member."""
        bw = self.bandwidth
        if len(members) < 2:
            return 0
        return sum(max(bw[v][u] for u in members if u != v) for v in members)

    def ring_upper_bound(self, members: Sequence[int]) -> int:
        """No ring through `members` beats this: every GPU needs two ring links of its own."""
        bw = self.bandwidth
        if len(members) < 2:
            return 0
        if len(members) == 2:
            return bw[members[0]][members[1]]
        bound = None
        for v in members:
            first = second = -1
            for u in members:
                if u != v:
                    w = bw[v][u]
                    if w > first:
                        first, second = w, first
                    elif w > second:
                        second = w
            bound = second if bound is None else min(bound, second)
        return bound if bound is not None else 0

    # ------------------------------------------------------------------ set search helpers

    def canonical_subsets(self, members: Sequence[int], k: int) -> Iterator[tuple[int, ...]]:
        """Every k-subset of `members` up to swapping interchangeable GPUs.

        Interchangeable GPUs (identical links to every other GPU, same NUMA group and NIC
        relations) give sets of identical quality; only the subset taking the lowest indices
        of each class is produced, which is also the lexicographically smallest of its kind.
        """
        classes: dict[int, list[int]] = {}
        for i in sorted(members):
            classes.setdefault(self.twin_of[i], []).append(i)
        ordered = [classes[c] for c in sorted(classes)]
        if all(len(c) == 1 for c in ordered):
            yield from combinations(sorted(members), k)
            return
        sizes = [len(c) for c in ordered]
        tails = [sum(sizes[i:]) for i in range(len(sizes))] + [0]

        def pick(position: int, remaining: int, chosen: list[int]) -> Iterator[tuple[int, ...]]:
            if remaining == 0:
                yield tuple(sorted(chosen))
                return
            if position == len(ordered) or tails[position] < remaining:
                return
            for take in range(min(remaining, sizes[position]), -1, -1):
                yield from pick(position + 1, remaining - take, chosen + ordered[position][:take])

        yield from pick(0, k, [])

    def best_ring_within(self, mask: int, k: int) -> int:
        """The best ring bottleneck any k GPUs of `mask` can form (0 when fewer than k, or k < 2)."""
        key = (mask, k)
        cached = self._best_rings.get(key)
        if cached is not None:
            return cached
        members = members_of(mask)
        best = 0
        if k >= 2 and len(members) >= k:
            bw = self.bandwidth
            ceiling = max(bw[a][b] for a, b in combinations(members, 2))
            best = -1
            for subset in self.canonical_subsets(members, k):
                if self.ring_upper_bound(subset) <= best:
                    continue
                best = max(best, self.ring_bottleneck(mask_of(subset)))
                if best >= ceiling:
                    break
            best = max(best, 0)
        if len(self._best_rings) >= MEMO_LIMIT:
            self._best_rings.clear()
        self._best_rings[key] = best
        return best

    # ------------------------------------------------------------------ internals

    def _compute_ring(self, members: tuple[int, ...]) -> int:
        bw = self.bandwidth
        k = len(members)
        if k < 2:
            return 0
        if k == 2:
            return bw[members[0]][members[1]]
        if k == 3:
            a, b, c = members
            return min(bw[a][b], bw[b][c], bw[a][c])
        ceiling = self.ring_upper_bound(members)
        levels = sorted({bw[a][b] for a, b in combinations(members, 2) if bw[a][b] <= ceiling}, reverse=True)
        for level in levels:
            adjacency = [
                mask_of([j for j, u in enumerate(members) if u != v and bw[v][u] >= level]) for v in members
            ]
            if has_hamiltonian_cycle(adjacency):
                return level
        return 0  # unreachable: the lowest level is a complete graph


def has_hamiltonian_cycle(adjacency: Sequence[int]) -> bool:
    """Whether the graph (adjacency bitmasks over local indices) has a Hamiltonian cycle (k ≥ 3)."""
    k = len(adjacency)
    degrees = [a.bit_count() for a in adjacency]
    if min(degrees) < 2:
        return False
    if 2 * min(degrees) >= k:  # Dirac's theorem
        return True
    # Paths from vertex 0: layer by layer, mask of visited -> bitmask of possible end vertices.
    frontier = {1: 1}
    for _ in range(k - 1):
        following: dict[int, int] = {}
        for visited, ends in frontier.items():
            while ends:
                low = ends & -ends
                ends ^= low
                options = adjacency[low.bit_length() - 1] & ~visited
                while options:
                    step = options & -options
                    options ^= step
                    grown = visited | step
                    following[grown] = following.get(grown, 0) | step
        frontier = following
        if not frontier:
            return False
    return bool(frontier.get((1 << k) - 1, 0) & adjacency[0])


_BY_IDENTITY_LIMIT = 65_536
_by_identity: dict[int, tuple[NodeTopology, LinkTable]] = {}


def link_table(topology: NodeTopology) -> LinkTable:
    """The (cached) search table of a topology. GPU UUIDs only name the devices, so machines
    wired alike share one table however many nodes there are. The table is also remembered
    by the topology object itself (kept alive with it, so its id is not reused), which spares
    hashing the whole topology on every placement."""
    hit = _by_identity.get(id(topology))
    if hit is not None and hit[0] is topology:
        return hit[1]
    if any(g.uuid for g in topology.gpus):
        table = _wired_table(replace(topology, gpus=tuple(replace(g, uuid="") for g in topology.gpus)))
    else:
        table = _wired_table(topology)
    if len(_by_identity) >= _BY_IDENTITY_LIMIT:
        _by_identity.clear()
    _by_identity[id(topology)] = (topology, table)
    return table


@lru_cache(maxsize=512)
def _wired_table(topology: NodeTopology) -> LinkTable:
    n = topology.gpu_count
    bandwidth = [[0] * n for _ in range(n)]
    for a, b in combinations(range(n), 2):
        bandwidth[a][b] = bandwidth[b][a] = pair_bandwidth_units(topology, a, b)
    groups = tuple(locality_group(topology, i) for i in range(n))
    nic_ranks = [nic_closeness(topology, nic.name) or () for nic in topology.nics]
    twin_of = list(range(n))
    for j in range(n):
        for i in range(j):
            if twin_of[i] != i:
                continue
            if _interchangeable(bandwidth, groups, nic_ranks, i, j):
                twin_of[j] = i
                break
    table = LinkTable(
        topology=topology,
        bandwidth=tuple(tuple(row) for row in bandwidth),
        groups=groups,
        twin_of=tuple(twin_of),
    )
    if n <= PRECOMPUTE_MAX_GPUS:
        for mask in range(1 << n):
            table.ring_bottleneck(mask)
    return table


def _interchangeable(
    bandwidth: list[list[int]],
    groups: Sequence[str | None],
    nic_ranks: Sequence[tuple[int, ...]],
    i: int,
    j: int,
) -> bool:
    if groups[i] != groups[j] or any(ranks[i] != ranks[j] for ranks in nic_ranks if ranks):
        return False
    return all(bandwidth[i][x] == bandwidth[j][x] for x in range(len(bandwidth)) if x not in (i, j))


# ---------------------------------------------------------------------------- the search


@dataclass(frozen=True, slots=True)
class BestSet:
    gpus: tuple[int, ...]
    key: SetKey


def set_key(
    table: LinkTable, gpus: Sequence[int], free: Sequence[int], nic_ranks: Sequence[int] | None
) -> SetKey:
    """The full quality key of `gpus`, chosen out of the free GPUs `free`."""
    mask = mask_of(gpus)
    leftover = mask_of(free) & ~mask
    return SetKey(
        ring=table.ring_bottleneck(mask),
        pair_total=table.pair_total_of_mask(mask),
        nic_rank_sum=sum(nic_ranks[i] for i in gpus) if nic_ranks else 0,
        negative_numa_nodes=-table.numa_nodes(gpus),
        leftover_ring=table.best_ring_within(leftover, max(len(gpus), 2)),
        leftover_pairs=table.leftover_pairs(members_of(leftover)),
    )


def best_set(
    table: LinkTable, free: Sequence[int], k: int, nic_ranks: Sequence[int] | None = None
) -> BestSet | None:
    """The best k GPUs out of `free` (see the module docstring), or None when fewer are free.

    Terms are computed lazily: the ring and pair total decide most comparisons, locality
    and leftovers are only computed for candidates that tie on everything before them.
    """
    if k < 1 or len(free) < k:
        return None
    free_mask = mask_of(free)
    leftover_size = max(k, 2)
    best: tuple[int, ...] | None = None
    best_head: tuple[int, int, int, int] = (-1, -1, -1, -1)
    best_tail: tuple[int, int] | None = None

    def tail_of(gpus_mask: int) -> tuple[int, int]:
        leftover = free_mask & ~gpus_mask
        return (
            table.best_ring_within(leftover, leftover_size),
            table.leftover_pairs(members_of(leftover)),
        )

    for subset in table.canonical_subsets(free, k):
        mask = mask_of(subset)
        ring = table.ring_bottleneck(mask)
        if ring < best_head[0]:
            continue
        total = table.pair_total_of_mask(mask)
        if ring == best_head[0] and total < best_head[1]:
            continue
        nic_sum = sum(nic_ranks[i] for i in subset) if nic_ranks else 0
        head = (ring, total, nic_sum, -table.numa_nodes(subset))
        if head < best_head:
            continue
        if head > best_head:
            best, best_head, best_tail = subset, head, None
            continue
        assert best is not None
        if best_tail is None:
            best_tail = tail_of(mask_of(best))
        tail = tail_of(mask)
        if tail > best_tail or (tail == best_tail and subset < best):
            best, best_tail = subset, tail
    if best is None:
        return None
    if best_tail is None:
        best_tail = tail_of(mask_of(best))
    return BestSet(best, SetKey(*best_head, *best_tail))
