"""The besteffort port reproduces go-gpuallocator's own test expectations (topology.md §1.8)."""

from __future__ import annotations

from itertools import combinations

import pytest

from bench.gpuallocator_baseline import (
    besteffort_allocate,
    iterate_partitions,
    partition_count,
    scores_from_links,
    scores_from_topology,
)
from tests.support.machines import DGX1_V100_NVLINKS, a100_pcie_nv12_pairs, dgx1_v100, hgx_h100
from topology.model import LinkKind

Pair = tuple[int, int]


def _halves(count: int, within: dict[Pair, LinkKind], otherwise: LinkKind) -> dict[Pair, LinkKind]:
    """PCIe levels: `within` for listed pairs, `otherwise` in the same half, CrossCPU across."""
    levels = {}
    for a, b in combinations(range(count), 2):
        same_half = (a < count // 2) == (b < count // 2)
        levels[(a, b)] = within.get((a, b), otherwise if same_half else LinkKind.SYS)
    return levels


PIX_SIBLINGS_VOLTA = {p: LinkKind.PIX for p in [(0, 1), (2, 3), (4, 5), (6, 7)]}
DGX1_VOLTA_SCORES = scores_from_links(8, _halves(8, PIX_SIBLINGS_VOLTA, LinkKind.PHB), DGX1_V100_NVLINKS)

PASCAL_NV1 = [(0, 1), (0, 2), (0, 3), (0, 4), (1, 2), (1, 3), (1, 5), (2, 3)]
PASCAL_NV1 += [(2, 6), (3, 7), (4, 5), (4, 6), (4, 7), (5, 6), (5, 7), (6, 7)]
PIX_SIBLINGS_PASCAL = {p: LinkKind.PIX for p in [(0, 2), (1, 3), (4, 6), (5, 7)]}
DGX1_PASCAL_SCORES = scores_from_links(
    8, _halves(8, PIX_SIBLINGS_PASCAL, LinkKind.PHB), dict.fromkeys(PASCAL_NV1, 1)
)

# 4x RTX 8000: NV2 on (0,3) and (1,2), which carry no PCIe entry at all.
RTX8000_SCORES = scores_from_links(
    4,
    {(0, 1): LinkKind.NODE, (2, 3): LinkKind.NODE, (0, 2): LinkKind.SYS, (1, 3): LinkKind.SYS},
    {(0, 3): 2, (1, 2): 2},
)


def test_dgx1_volta_pair_scores_match_the_worked_example() -> None:
    s = DGX1_VOLTA_SCORES
    assert s[0][1:] == [150, 130, 230, 210, 10, 10, 10]
    assert s[2] == [130, 230, 0, 250, 10, 10, 110, 10]
    assert s[7] == [10, 10, 10, 110, 230, 130, 250, 0]


BESTEFFORT_CASES = [
    ("Single NVLINK, prefer same switch", [0, 2, 4, 5], [], 2, [4, 5]),
    ("Single NVLINK, prefer same socket", [0, 4, 5, 6], [], 2, [5, 6]),
    ("Prefer dual NVLINK same socket", [0, 3, 1], [], 2, [0, 3]),
    ("Prefer dual NVLINK cross socket", [0, 1, 4], [], 2, [0, 4]),
    ("Must include, size 1", list(range(8)), [4], 1, [4]),
    ("Must include, size 2", list(range(8)), [4], 2, [4, 7]),
    ("Must include, size 4", list(range(8)), [4], 4, [4, 5, 6, 7]),
    ("Must include with unavailable device", list(range(1, 8)), [0, 1, 2, 3], 4, []),
    ("Must include with full set specified", list(range(8)), [0, 2, 4, 6], 4, [0, 2, 4, 6]),
    ("Too many required", list(range(8)), [1, 2, 3, 4, 5, 6], 4, []),
    ("Required more than available", [1, 2, 3, 4, 5], list(range(1, 7)), 1, []),
]


@pytest.mark.parametrize(
    ("available", "required", "size", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in BESTEFFORT_CASES],
)
def test_besteffort_on_dgx1_volta(
    available: list[int], required: list[int], size: int, expected: list[int]
) -> None:
    result = besteffort_allocate(DGX1_VOLTA_SCORES, available, required, size)
    assert sorted(d for d in result if d is not None) == expected
    assert None not in result


def _sequential(scores: list[list[int]], count: int, sizes: list[int]) -> list[list[int]]:
    remaining = list(range(count))
    taken: list[list[int]] = []
    for size in sizes:
        result = besteffort_allocate(scores, sorted(remaining), [], size)
        taken.append(sorted(d for d in result if d is not None))
        remaining = [d for d in remaining if d not in result]
    return taken


@pytest.mark.parametrize(
    ("scores", "sizes", "expected"),
    [
        pytest.param(RTX8000_SCORES, [1] * 5, [[0], [1], [2], [3], []], id="4x RTX8000 size 1"),
        pytest.param(RTX8000_SCORES, [2, 2, 1], [[0, 3], [1, 2], []], id="4x RTX8000 size 2"),
        pytest.param(RTX8000_SCORES, [4], [[0, 1, 2, 3]], id="4x RTX8000 size 4"),
        pytest.param(DGX1_PASCAL_SCORES, [1] * 8, [[i] for i in range(8)], id="DGX-1 Pascal size 1"),
        pytest.param(DGX1_PASCAL_SCORES, [2] * 4, [[0, 2], [1, 3], [4, 6], [5, 7]], id="DGX-1 Pascal size 2"),
        pytest.param(DGX1_PASCAL_SCORES, [4] * 2, [[0, 1, 2, 3], [4, 5, 6, 7]], id="DGX-1 Pascal size 4"),
        pytest.param(DGX1_PASCAL_SCORES, [8], [list(range(8))], id="DGX-1 Pascal size 8"),
        pytest.param(DGX1_VOLTA_SCORES, [1] * 8, [[i] for i in range(8)], id="DGX-1 Volta size 1"),
        pytest.param(DGX1_VOLTA_SCORES, [2] * 4, [[0, 3], [1, 2], [4, 7], [5, 6]], id="DGX-1 Volta size 2"),
        pytest.param(DGX1_VOLTA_SCORES, [4] * 2, [[0, 1, 2, 3], [4, 5, 6, 7]], id="DGX-1 Volta size 4"),
        pytest.param(DGX1_VOLTA_SCORES, [8], [list(range(8))], id="DGX-1 Volta size 8"),
    ],
)
def test_sequential_allocations(scores: list[list[int]], sizes: list[int], expected: list[list[int]]) -> None:
    assert _sequential(scores, len(scores), sizes) == expected


def test_partitions_of_four_devices() -> None:
    assert list(iterate_partitions([0, 1, 2, 3], 2)) == [[[0, 1], [2, 3]], [[0, 2], [1, 3]], [[0, 3], [1, 2]]]
    threes = list(iterate_partitions([0, 1, 2, 3], 3))
    assert len(threes) == 4
    for partition in threes:
        assert sorted(sum(d is None for d in s) for s in partition) == [0, 2]


@pytest.mark.parametrize(
    ("n", "k", "count"), [(8, 2, 105), (8, 3, 280), (8, 4, 35), (16, 2, 2_027_025), (16, 8, 6435)]
)
def test_partition_counts(n: int, k: int, count: int) -> None:
    assert partition_count(n, k) == count


def test_padded_set_can_be_returned_as_the_original_does() -> None:
    # An NVLink pair plus a pad beats a complete 3-GPU PCIe set (topology.md §1.7 item 1).
    scores = scores_from_links(5, {(a, b): LinkKind.SYS for a, b in combinations(range(5), 2)}, {(3, 4): 4})
    assert None in besteffort_allocate(scores, list(range(5)), [], 3)


def test_scores_from_a_parsed_topology() -> None:
    # NVSwitch hides NVLink from go-gpuallocator: only the NUMA-approximated PCIe level is left.
    h100 = scores_from_topology(hgx_h100())
    assert (h100[0][1], h100[0][5]) == (20, 10)
    pairs = scores_from_topology(a100_pcie_nv12_pairs())
    assert (pairs[0][2], pairs[0][1], pairs[0][4]) == (1220, 10, 10)
    volta = scores_from_topology(dgx1_v100())
    assert (volta[0][3], volta[0][4]) == (220, 210)
