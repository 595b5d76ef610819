"""Node scoring (prioritize): fragmentation first, packing and NVLink pairs as tie-breakers."""

from __future__ import annotations

from dataclasses import replace

from extender.config import ExtenderConfig
from tests.support.machines import a100_pcie_nv12_pairs, hgx_h100, state
from topology.placement import place
from topology.scheduling import GpuShare, GpuUsage, NodeState, Placement, Policy, Request, WholeGpus
from topology.scoring import Ranking, RawTerms, combine, default_fragmentation, node_terms, rank_nodes

BALANCED = ExtenderConfig().policy(None) or Policy()


def ranked(nodes: list[NodeState], request: Request, policy: Policy = BALANCED) -> Ranking:
    candidates = []
    for node in nodes:
        outcome = place(node, request, policy)
        assert isinstance(outcome, Placement), outcome
        candidates.append((node, outcome))
    return rank_nodes(candidates, request, policy)


def by_name(ranking: Ranking) -> dict[str, tuple[int, float, float]]:
    return {r.node: (r.score, r.raw, r.link) for r in ranking}


def shared(node: NodeState, index: int, units: int) -> NodeState:
    usage = list(node.usage)
    usage[index] = GpuUsage(units_used=units)
    return NodeState(node.name, node.topology, tuple(usage), node.units_per_gpu)


def test_the_default_policy_is_balanced_with_equal_weights() -> None:
    assert (BALANCED.weight_link_quality, BALANCED.weight_fragmentation, BALANCED.weight_packing) == (1, 1, 1)


def test_a_one_gpu_pod_prefers_an_unpaired_gpu_to_breaking_an_nvlink_pair() -> None:
    # a100_pcie_nv12_pairs bridges (0,2), (1,3), (4,5), (6,7) with NV12
    odd = state(a100_pcie_nv12_pairs(), used=(1, 3, 4, 6, 7), name="odd-one-out")  # free 0, 2 (a pair) and 5
    pair = state(a100_pcie_nv12_pairs(), used=(1, 3, 4, 5, 6, 7), name="last-pair")  # free 0, 2 only
    ranking = ranked([pair, odd], WholeGpus(1))
    scores = by_name(ranking)
    assert ranking.details("odd-one-out").placement.gpus == (5,)  # type: ignore[union-attr]
    assert scores["odd-one-out"][2] == 1.0 > scores["last-pair"][2]
    # the link term is a tie-breaker: higher raw score; the integer bucket may tie, never invert
    assert scores["odd-one-out"][1] > scores["last-pair"][1]
    assert scores["odd-one-out"][0] >= scores["last-pair"][0]
    # on the link term alone the odd one out wins outright
    link_only = replace(BALANCED, weight_fragmentation=0.0, weight_packing=0.0)
    alone = by_name(ranked([pair, odd], WholeGpus(1), link_only))
    assert alone["odd-one-out"][0] > alone["last-pair"][0]


def test_the_link_term_does_not_favour_an_empty_node() -> None:
    empty = state(a100_pcie_nv12_pairs(), name="empty")
    partly = state(a100_pcie_nv12_pairs(), used=(0, 1, 3), name="partly-used")  # free 2 (unpaired), 4-7
    last_pair = state(a100_pcie_nv12_pairs(), used=(1, 3, 4, 5, 6, 7), name="last-pair")
    for request in (WholeGpus(1), GpuShare(units=50)):
        links = {r.node: r.link for r in ranked([empty, partly, last_pair], request)}
        assert links["empty"] <= links["partly-used"]
        assert links["empty"] == links["last-pair"]  # both lose one NV12 pair


def test_a_fuller_node_ranks_higher_under_balanced() -> None:
    fuller = state(hgx_h100(), used=range(6), name="fuller")
    emptier = state(hgx_h100(), used=range(2), name="emptier")
    scores = by_name(ranked([emptier, fuller], WholeGpus(1)))
    assert scores["fuller"][1] > scores["emptier"][1]
    assert scores["fuller"][0] >= scores["emptier"][0]


def test_spread_prefers_the_emptier_node() -> None:
    spread = ExtenderConfig().policy("spread")
    assert spread is not None
    fuller = state(hgx_h100(), used=range(6), name="fuller")
    emptier = state(hgx_h100(), used=range(2), name="emptier")
    scores = by_name(ranked([emptier, fuller], WholeGpus(1), spread))
    assert scores["emptier"][1] > scores["fuller"][1]


def test_a_share_fills_a_sliver_rather_than_opening_a_fresh_gpu() -> None:
    sliver = shared(state(hgx_h100(), used=range(1, 8), name="sliver"), 0, 53)  # 47 units free
    fresh = state(hgx_h100(), used=range(1, 8), name="fresh")
    ranking = ranked([fresh, sliver], GpuShare(units=47))
    scores = by_name(ranking)
    assert scores["sliver"][0] > scores["fresh"][0]
    details = ranking.details("sliver")
    assert details is not None and details.fragmentation_delta < 0 < details.fragmentation - 0.5


def test_a_multi_gpu_pod_prefers_the_better_connected_set() -> None:
    used = (0, 1, 4, 6)  # same usage on both, so fragmentation and packing agree
    nvswitch = state(hgx_h100(), used=used, name="nvswitch")
    broken_pairs = state(a100_pcie_nv12_pairs(), used=used, name="broken-pairs")  # only SYS pairs left
    scores = by_name(ranked([broken_pairs, nvswitch], WholeGpus(2)))
    assert scores["nvswitch"][2] == 1.0 > scores["broken-pairs"][2]
    assert scores["nvswitch"][1] > scores["broken-pairs"][1]
    assert scores["nvswitch"][0] >= scores["broken-pairs"][0]


def test_duplicate_candidates_do_not_change_a_score() -> None:
    nodes = [
        state(hgx_h100(), name="a"),
        state(a100_pcie_nv12_pairs(), used=(0,), name="b"),
        state(a100_pcie_nv12_pairs(), used=(0, 2, 4), name="c"),
    ]
    frag = default_fragmentation()
    for request in (WholeGpus(1), WholeGpus(2), GpuShare(units=30)):
        terms: list[RawTerms] = []
        for node in nodes:
            outcome = place(node, request, BALANCED)
            assert isinstance(outcome, Placement)
            terms.append(node_terms(node, outcome, request, BALANCED, frag))
        once = combine(terms, BALANCED).scores
        doubled = combine(terms + [replace(t, node=t.node + "-copy") for t in terms], BALANCED).scores
        assert doubled[: len(terms)] == once == doubled[len(terms) :]


def test_scores_are_integers_within_the_extender_range() -> None:
    nodes = [state(hgx_h100(), used=range(k), name=f"n{k}") for k in range(8)]
    ranking = ranked(nodes, WholeGpus(1))
    assert all(isinstance(s, int) and 0 <= s <= 10 for s in ranking.scores)
    assert ranked(nodes, WholeGpus(1)).scores == ranking.scores  # deterministic


def test_with_cpu_known_a_node_whose_cpu_would_run_out_scores_lower() -> None:
    from topology.fragmentation import TypicalRequest
    from topology.scoring import NodeResourcesContext

    # typical pods: one whole GPU with 8 CPUs; both nodes have 4 idle GPUs
    workload = (TypicalRequest(gpu_milli=1000, gpu_count=1, cpu_milli=8000, memory_mib=0, probability=1.0),)
    starved = state(a100_pcie_nv12_pairs(), used=(0, 1, 2, 3), name="cpu-starved")
    roomy = state(a100_pcie_nv12_pairs(), used=(0, 1, 2, 3), name="cpu-roomy")
    request = WholeGpus(1)
    pod_cpu = 4000

    def terms(node: NodeState, free_cpu: int) -> RawTerms:
        placement = place(node, request, BALANCED)
        assert isinstance(placement, Placement)
        resources = NodeResourcesContext(free_cpu, None, free_cpu - pod_cpu, None, workload)
        return node_terms(node, placement, request, BALANCED, default_fragmentation(), resources)

    # after the pod the starved node keeps 3 idle GPUs with 6 CPUs (< 8): all stranded
    ranking = combine([terms(starved, 10_000), terms(roomy, 64_000)], BALANCED)
    low, high = ranking.details("cpu-starved"), ranking.details("cpu-roomy")
    assert low is not None and high is not None
    assert low.fragmentation_delta > 0 == high.fragmentation_delta
    assert low.score < high.score
    # without CPU (the extender today) the two nodes are equal
    blind = [
        node_terms(n, terms(n, 64_000).placement, request, BALANCED, default_fragmentation())
        for n in (starved, roomy)
    ]
    assert len(set(combine(blind, BALANCED).scores)) == 1
