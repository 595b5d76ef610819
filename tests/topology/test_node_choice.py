"""Choosing the node (decideNode) and learning the workload fragmentation is measured against."""

from __future__ import annotations

import pytest

from contract.scheduling_policy import PolicyError, decode_scheduling_policy
from topology.fragmentation import DEFAULT_WORKLOAD, PodShape
from topology.node_choice import (
    BALANCE_LEVELS,
    FRAGMENTATION_STEP_MILLI,
    MULTI_GPU_BALANCE_LEVELS,
    choose_node,
    decision_key,
    name_rank,
    ranked_choice,
)
from topology.scheduling import Placement, ScoreBreakdown
from topology.scoring import RawTerms, cpu_gpu_imbalance, cpu_shortfall, imbalance_change
from topology.workload_learning import LearningSettings, WorkloadLearner

pytestmark = pytest.mark.timeout(30)


def _terms(
    node: str, delta: float, imbalance: float = 0.0, ring: float = 0.0, cpu_short: float = 0.0
) -> RawTerms:
    placement = Placement(node, (0,), (), ScoreBreakdown())
    return RawTerms(
        node,
        (ring, 0.0, 0.0),
        delta,
        1.0,
        placement,
        imbalance=imbalance,
        link_relative=ring > 0,
        cpu_short=cpu_short,
    )


def test_the_smaller_fragmentation_step_wins_whatever_else() -> None:
    """A node one fragmentation step better wins over a better balanced or better ranked one."""
    good = _terms("b", -FRAGMENTATION_STEP_MILLI, imbalance=0.9, cpu_short=0.9)
    worse = _terms("a", 0.0, imbalance=0.0)
    assert choose_node([worse, good]) is good


def test_within_a_step_balance_then_cpu_shortfall_then_link_then_the_name_order_decide() -> None:
    """Equal steps: the node whose CPU and GPUs run out together; then the one left with fewer GPUs
    short of CPU; then the better ring; then CRC-32."""
    balanced, lopsided = _terms("x", 10.0, 0.05, cpu_short=0.9), _terms("y", 20.0, 0.5)
    assert choose_node([lopsided, balanced]) is balanced
    enough, short = _terms("u", 0.0, 0.1, ring=100.0), _terms("v", 0.0, 0.1, ring=300.0, cpu_short=0.5)
    assert choose_node([short, enough]) is enough
    fast, slow = _terms("p", 0.0, ring=300.0), _terms("q", 0.0, ring=100.0)
    assert choose_node([slow, fast]) is fast
    a, b = _terms("node-a", 0.0), _terms("node-b", 0.0)
    first = a if name_rank("node-a") < name_rank("node-b") else b
    assert choose_node([a, b]) is first and choose_node([b, a]) is first
    assert decision_key(a)[:4] == decision_key(b)[:4]
    assert choose_node([]) is None


def test_multi_gpu_pods_are_ranked_in_finer_balance_bands() -> None:
    """Two changes within one coarse band tie for a one-GPU pod but not for a multi-GPU pod."""
    assert MULTI_GPU_BALANCE_LEVELS > BALANCE_LEVELS
    low, high = 0.1, 0.3  # both in the first third, in different fifths
    assert decision_key(_terms("a", 0.0, low))[:4] == decision_key(_terms("b", 0.0, high))[:4]
    near, far = _terms("a", 0.0, low, ring=100.0), _terms("b", 0.0, high, ring=100.0)
    assert decision_key(near, 100.0)[:4] < decision_key(far, 100.0)[:4]


def test_cpu_shortfall_counts_only_gpus_left_beside_too_little_cpu() -> None:
    """Free GPUs 50% beside free CPU 20.9% fall short by 0.30; CPU to spare falls short by nothing."""
    assert cpu_shortfall(20_900, 100_000, 0.5) == pytest.approx(0.3)
    assert cpu_shortfall(90_000, 100_000, 0.5) == 0.0
    assert cpu_shortfall(0, 100_000, 1.0) == 0.0
    assert cpu_shortfall(5, 0, 0.0) == 0.0


def test_imbalance_counts_free_cpu_in_whole_percent() -> None:
    """Free CPU 40.9% against GPUs 60% used (40% free): 0.40 vs 0.40 is balanced."""
    assert cpu_gpu_imbalance(40_900, 100_000, 0.6) == pytest.approx(0.0)
    assert cpu_gpu_imbalance(0, 100_000, 0.0) == pytest.approx(1.0)
    assert cpu_gpu_imbalance(5, 0, 0.5) == 0.0


def test_a_pod_asking_for_no_cpu_changes_every_node_with_cpu_to_spare_alike() -> None:
    """One GPU of eight on a node with all CPU free: the same change and no CPU shortfall on an
    empty node as on one already half full, so the two tie (and fill in name order); on a node
    whose CPU is nearly gone, the same pod brings CPU and GPUs together and ranks first."""
    empty = imbalance_change(64_000, 64_000, 64_000, 0.0, 1 / 8)
    half = imbalance_change(64_000, 64_000, 64_000, 4 / 8, 5 / 8)
    assert empty == pytest.approx(half) == pytest.approx(1 / 8)
    assert cpu_shortfall(64_000, 64_000, 1 / 8) == cpu_shortfall(64_000, 64_000, 5 / 8) == 0.0
    assert imbalance_change(6_400, 6_400, 64_000, 0.0, 1 / 8) == pytest.approx(-1 / 8)
    a, b = _terms("node-a", 0.0, empty), _terms("node-b", 0.0, half)
    assert decision_key(a)[:4] == decision_key(b)[:4]
    short = cpu_shortfall(6_400, 64_000, 1 / 8)
    found = choose_node([a, b, _terms("node-c", 0.0, -1 / 8, cpu_short=short)])
    assert found is not None and found.node == "node-c"


def test_identical_pods_asking_for_little_cpu_fill_one_identical_node_after_another() -> None:
    """On identical 8-GPU nodes with 64 CPUs, 1-GPU pods asking for one CPU each never rank an
    empty node ahead of a partly used one, so each node fills before the next is opened."""
    gpus, cpu, capacity = 8, 1_000, 64_000
    used = [0] * 6
    for _ in range(3 * gpus):
        candidates = []
        for i, pods in enumerate(used):
            if pods == gpus:
                continue
            free_before = capacity - pods * cpu
            change = imbalance_change(
                free_before, free_before - cpu, capacity, pods / gpus, (pods + 1) / gpus
            )
            short = cpu_shortfall(free_before - cpu, capacity, (pods + 1) / gpus)
            candidates.append(_terms(f"node-{i}", 0.0, change, cpu_short=short))
        empty = [decision_key(t)[:4] for t in candidates if used[int(t.node[5:])] == 0]
        partly = [decision_key(t)[:4] for t in candidates if used[int(t.node[5:])] > 0]
        assert all(p <= e for p in partly for e in empty)
        chosen = choose_node(candidates)
        assert chosen is not None
        used[int(chosen.node[5:])] += 1
    assert sorted(used) == [0, 0, 0, gpus, gpus, gpus]


def test_the_learner_starts_from_its_prior_and_moves_to_what_it_sees() -> None:
    """Before any pod: the prior's shapes. After many pods of one shape: that shape dominates, and
    the same sequence gives the same workloads and versions."""
    learner = WorkloadLearner()
    assert {(m.gpu_milli, m.gpu_count) for m in learner.workload} <= {
        (m.gpu_milli, m.gpu_count) for m in DEFAULT_WORKLOAD
    }
    shapes = [PodShape(4000, 500, 1)] * 500 + [PodShape(0, 0, 0)] * 10
    learner.observe_all(shapes)
    again = WorkloadLearner()
    again.observe_all(shapes)
    assert learner.workload == again.workload and learner.version == again.version
    assert learner.workload[0].gpu_milli == 500 and learner.workload[0].cpu_milli == 4000
    assert learner.workload[0].probability > 0.8  # as published after 256 pods (a power of two)
    assert learner.observed == 500  # CPU-only pods are not counted
    assert abs(sum(m.probability for m in learner.workload) - 1.0) < 1e-9


def test_old_pods_fade_with_the_half_life() -> None:
    """With a half-life of 100 pods, a shape last seen 400 pods ago falls below one seen since."""
    learner = WorkloadLearner(
        LearningSettings(half_life_pods=100, prior_pods=0, refresh_every=100, coverage=1.0)
    )
    learner.observe_all([PodShape(1000, 1000, 1)] * 400 + [PodShape(1000, 300, 1)] * 400)
    by_share = {m.gpu_milli: m.probability for m in learner.workload}
    assert by_share[300] > 0.9 > by_share[1000]


def _policy(spec: dict[str, object]) -> dict[str, object]:
    return {
        "apiVersion": "linkpack.io/v1alpha1",
        "kind": "GpuSchedulingPolicy",
        "metadata": {"name": "p"},
        "spec": spec,
    }


def test_decide_node_defaults_to_true_and_must_be_a_flag() -> None:
    """spec.decideNode: absent means true; false keeps the scores; anything else is named."""
    assert decode_scheduling_policy(_policy({})).decide_node
    assert not decode_scheduling_policy(_policy({"decideNode": False})).decide_node
    with pytest.raises(PolicyError, match="decideNode"):
        decode_scheduling_policy(_policy({"decideNode": "yes"}))


def test_the_choice_names_the_runner_up_and_the_step_that_told_them_apart() -> None:
    """`ranked_choice` agrees with `choose_node` and names the first step where the runner-up
    lost: fragmentation, balance, shortfall, ring, and for equal nodes the name order."""
    cases = [
        ([_terms("a", 0.0), _terms("b", -FRAGMENTATION_STEP_MILLI)], "fragmentation"),
        ([_terms("x", 10.0, 0.05), _terms("y", 20.0, 0.5)], "CPU/GPU balance"),
        ([_terms("u", 0.0, 0.1, cpu_short=0.0), _terms("v", 0.0, 0.1, cpu_short=0.5)], "CPU shortfall"),
        ([_terms("p", 0.0, ring=300.0), _terms("q", 0.0, ring=100.0)], "ring bottleneck"),
        ([_terms("node-a", 0.0), _terms("node-b", 0.0)], "name order"),
    ]
    for candidates, step in cases:
        choice = ranked_choice(candidates)
        assert choice is not None and choice.chosen is choose_node(candidates), step
        assert choice.runner_up is not None and choice.runner_up is not choice.chosen
        assert choice.decided_by == step
    alone = ranked_choice([_terms("solo", 0.0)])
    assert alone is not None and alone.runner_up is None and alone.decided_by == ""
    assert ranked_choice([]) is None
