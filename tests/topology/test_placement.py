"""Whole-GPU and MIG placement on named hardware, every misfit reason, apply and release."""

from __future__ import annotations

import pytest

from tests.support.machines import (
    a100_pcie_nv12_pairs,
    a100_sxm_mig_pair,
    dgx1_v100,
    dgx2_v100,
    hgx_h100,
    rtx3090_two_socket,
    rtx4090_two_socket_all_sys,
    state,
)
from topology.model import Gpu, NodeTopology
from topology.placement import DEFAULT_POLICY, apply_placement, place, release_placement, set_quality
from topology.scheduling import (
    GpuGrant,
    MigSlice,
    Misfit,
    MisfitReason,
    NodeState,
    Placement,
    Policy,
    ScoreBreakdown,
    WholeGpus,
)


def placed(node: NodeState, request: WholeGpus | MigSlice, policy: Policy = DEFAULT_POLICY) -> Placement:
    outcome = place(node, request, policy)
    assert isinstance(outcome, Placement), outcome
    return outcome


def misfit(node: NodeState, request: WholeGpus | MigSlice, policy: Policy = DEFAULT_POLICY) -> Misfit:
    outcome = place(node, request, policy)
    assert isinstance(outcome, Misfit), outcome
    return outcome


WHOLE_GPU_CASES = [
    pytest.param(dgx1_v100(), (), 2, (0, 3), id="DGX-1 Volta: a pair on an empty node is an NV2 pair"),
    pytest.param(
        dgx1_v100(), (0,), 2, (2, 3), id="DGX-1 Volta: with GPU 0 busy, an NV2 pair that leaves 1-5 paired"
    ),
    pytest.param(dgx1_v100(), (), 4, (0, 1, 2, 3), id="DGX-1 Volta: four GPUs stay on one socket's quad"),
    pytest.param(dgx1_v100(), (), 8, tuple(range(8)), id="DGX-1 Volta: eight GPUs take the whole node"),
    pytest.param(hgx_h100(), (), 4, (0, 1, 2, 3), id="HGX H100: four GPUs on one NUMA node"),
    pytest.param(hgx_h100(), (0, 5), 3, (1, 2, 3), id="HGX H100: three GPUs fill socket 0's free three"),
    pytest.param(a100_pcie_nv12_pairs(), (), 2, (0, 2), id="PCIe NV-bridge box: a pair is a bridged pair"),
    pytest.param(
        a100_pcie_nv12_pairs(), (0,), 2, (1, 3), id="PCIe NV-bridge box: next pair is the next bridge"
    ),
    pytest.param(a100_pcie_nv12_pairs(), (0,), 1, (2,), id="1-GPU pod takes the orphan, not a bridged GPU"),
    pytest.param(
        a100_pcie_nv12_pairs(), (0, 4), 1, (2,), id="1-GPU pod takes the lowest orphan when two exist"
    ),
    pytest.param(
        a100_pcie_nv12_pairs(), (), 4, (0, 1, 2, 3), id="PCIe NV-bridge box: four GPUs keep two pairs"
    ),
    pytest.param(
        rtx3090_two_socket(), (0,), 3, (1, 2, 3), id="2-socket box: three GPUs stay in one NUMA node"
    ),
    pytest.param(
        rtx3090_two_socket(), (0,), 4, (4, 5, 6, 7), id="2-socket box: four GPUs take the full socket"
    ),
    pytest.param(
        rtx4090_two_socket_all_sys(), (0, 1, 2), 2, (4, 5), id="all-SYS box: a pair from one NUMA node"
    ),
    pytest.param(dgx2_v100(), (), 8, tuple(range(8)), id="DGX-2: eight GPUs on one socket"),
]


@pytest.mark.parametrize(("topology", "used", "count", "expected"), WHOLE_GPU_CASES)
def test_whole_gpu_placement_on_named_hardware(
    topology: NodeTopology, used: tuple[int, ...], count: int, expected: tuple[int, ...]
) -> None:
    assert placed(state(topology, used), WholeGpus(count)).gpus == expected


def test_dgx1_volta_pairs_reach_nv2_bandwidth_whatever_is_busy() -> None:
    for busy in range(8):
        result = placed(state(dgx1_v100(), (busy,)), WholeGpus(2))
        assert result.score.bottleneck_gbps == 50.0


def test_hgx_h100_any_set_reaches_full_nvswitch_bandwidth() -> None:
    for count in range(2, 9):
        assert placed(state(hgx_h100()), WholeGpus(count)).score.bottleneck_gbps == 450.0


def test_successive_pairs_on_an_nv_bridge_box_take_the_bridged_pairs_in_order() -> None:
    node = state(a100_pcie_nv12_pairs())
    taken = []
    for _ in range(4):
        result = placed(node, WholeGpus(2))
        taken.append(result.gpus)
        node = apply_placement(node, result)
    assert taken == [(0, 2), (1, 3), (4, 5), (6, 7)]


def test_successive_one_gpu_pods_never_leave_two_orphans_on_an_nv_bridge_box() -> None:
    node = state(a100_pcie_nv12_pairs())
    order = []
    for _ in range(8):
        result = placed(node, WholeGpus(1))
        order.append(result.gpus[0])
        node = apply_placement(node, result)
    assert order == [0, 2, 1, 3, 4, 5, 6, 7]


def test_near_nic_pulls_the_pair_next_to_that_nic() -> None:
    node = state(hgx_h100(with_nics=True))
    assert placed(node, WholeGpus(2, near_nic="mlx5_3")).gpus == (6, 7)
    assert placed(node, WholeGpus(2, near_nic="NIC1")).gpus == (2, 3)


def test_unhealthy_and_cordoned_gpus_are_skipped() -> None:
    node = state(hgx_h100(), unhealthy=(0,), cordoned=(1,))
    assert placed(node, WholeGpus(2)).gpus == (2, 3)


def test_min_bottleneck_is_met_when_a_set_reaches_it() -> None:
    result = placed(state(a100_pcie_nv12_pairs(), (0,)), WholeGpus(2), Policy(min_bottleneck_gbps=100))
    assert result.gpus == (1, 3)


def test_grants_carry_uuids_and_the_score_is_filled() -> None:
    result = placed(state(dgx1_v100()), WholeGpus(2))
    assert result.node == "node-a"
    assert result.grants == (GpuGrant(0, "GPU-dgx1v-0", whole=True), GpuGrant(3, "GPU-dgx1v-3", whole=True))
    score = result.score
    assert (score.bottleneck_gbps, score.total_pair_gbps, score.locality) == (50.0, 50.0, 1.0)
    assert score.leftover_gbps == 50.0
    assert dict(score.terms)["numa_nodes"] == 1.0
    assert score.fragmentation_delta > 0


def test_placement_is_deterministic() -> None:
    node = state(dgx2_v100(), (3, 9))
    assert {placed(node, WholeGpus(5)).gpus for _ in range(3)} == {placed(node, WholeGpus(5)).gpus}


# ----------------------------------------------------------------------------- misfits


MISFIT_CASES = [
    pytest.param(
        state(dgx1_v100()), WholeGpus(9), MisfitReason.TOO_FEW_GPUS, False, id="more than the node has"
    ),
    pytest.param(state(dgx1_v100()), WholeGpus(0), MisfitReason.INVALID_REQUEST, False, id="zero GPUs"),
    pytest.param(
        NodeState.empty("n", NodeTopology(gpus=())), WholeGpus(1), MisfitReason.NO_GPUS, False, id="no GPUs"
    ),
    pytest.param(
        state(dgx1_v100(), used=range(6)),
        WholeGpus(4),
        MisfitReason.TOO_FEW_FREE_GPUS,
        True,
        id="too few free",
    ),
    pytest.param(
        state(dgx1_v100(), unhealthy=range(8)),
        WholeGpus(1),
        MisfitReason.ALL_GPUS_UNHEALTHY,
        True,
        id="all sick",
    ),
    pytest.param(
        state(dgx1_v100(), unhealthy=range(5)),
        WholeGpus(4),
        MisfitReason.TOO_FEW_FREE_GPUS,
        True,
        id="sick + busy",
    ),
    pytest.param(
        state(hgx_h100()),
        WholeGpus(2, near_nic="mlx5_9"),
        MisfitReason.NIC_NOT_FOUND,
        False,
        id="no such NIC",
    ),
    pytest.param(
        state(a100_sxm_mig_pair()),
        WholeGpus(1),
        MisfitReason.TOO_FEW_GPUS,
        False,
        id="MIG GPUs are not whole",
    ),
]


@pytest.mark.parametrize(("node", "request_", "reason", "resolvable"), MISFIT_CASES)
def test_whole_gpu_misfits(
    node: NodeState, request_: WholeGpus, reason: MisfitReason, resolvable: bool
) -> None:
    outcome = misfit(node, request_)
    assert (outcome.reason, outcome.resolvable) == (reason, resolvable)


def test_link_quality_misfit_is_resolvable_when_busy_gpus_would_reach_it() -> None:
    node = state(a100_pcie_nv12_pairs(), used=(0, 1, 4, 6))
    outcome = misfit(node, WholeGpus(2), Policy(min_bottleneck_gbps=100))
    assert (outcome.reason, outcome.resolvable) == (MisfitReason.NO_SET_WITH_LINK_QUALITY, True)


def test_link_quality_misfit_is_unresolvable_when_no_set_could_ever_reach_it() -> None:
    outcome = misfit(state(a100_pcie_nv12_pairs()), WholeGpus(4), Policy(min_bottleneck_gbps=100))
    assert (outcome.reason, outcome.resolvable) == (MisfitReason.NO_SET_WITH_LINK_QUALITY, False)


# ----------------------------------------------------------------------------- MIG


def test_a_mig_slice_goes_to_the_gpu_already_partly_used() -> None:
    node = state(a100_sxm_mig_pair())
    first = placed(node, MigSlice("1g.10gb"))
    assert first.grants == (GpuGrant(0, "GPU-mig-0", whole=False, mig_uuid="MIG-0-2"),)
    node = apply_placement(node, first)
    assert placed(node, MigSlice("1g.10gb")).grants[0].mig_uuid == "MIG-0-3"
    assert placed(node, MigSlice("3g.40gb")).grants[0].mig_uuid == "MIG-0-0"


def test_mig_misfits() -> None:
    node = state(a100_sxm_mig_pair())
    assert misfit(node, MigSlice("7g.80gb")).reason is MisfitReason.NO_MIG_PROFILE
    assert misfit(node, MigSlice("7g.80gb")).resolvable is False
    assert misfit(node, MigSlice("")).reason is MisfitReason.INVALID_REQUEST
    for _ in range(2):
        node = apply_placement(node, placed(node, MigSlice("2g.20gb")))
    exhausted = misfit(node, MigSlice("2g.20gb"))
    assert (exhausted.reason, exhausted.resolvable) == (MisfitReason.MIG_PROFILE_EXHAUSTED, True)
    sick = misfit(state(a100_sxm_mig_pair(), unhealthy=(0, 1)), MigSlice("1g.10gb"))
    assert sick.reason is MisfitReason.ALL_GPUS_UNHEALTHY


# ----------------------------------------------------------------------------- apply / release / quality


def test_apply_then_release_gives_back_the_same_node() -> None:
    node = state(dgx1_v100(), used=(1,))
    result = placed(node, WholeGpus(3))
    after = apply_placement(node, result)
    assert all(after.usage[i].whole for i in result.gpus)
    assert release_placement(after, result) == node


def test_applying_twice_is_an_over_allocation() -> None:
    node = state(dgx1_v100())
    result = placed(node, WholeGpus(2))
    with pytest.raises(ValueError, match="already in use"):
        apply_placement(apply_placement(node, result), result)


def test_releasing_what_is_not_held_is_a_bug() -> None:
    node = state(dgx1_v100())
    with pytest.raises(ValueError, match="not held"):
        release_placement(node, placed(node, WholeGpus(1)))


def test_a_placement_for_another_node_is_refused() -> None:
    node = state(dgx1_v100())
    other = Placement("node-b", (0,), (GpuGrant(0, "GPU-dgx1v-0", whole=True),), ScoreBreakdown())
    with pytest.raises(ValueError, match="node-b"):
        apply_placement(node, other)


def test_set_quality_scores_any_set() -> None:
    topology = dgx1_v100()
    nv2_pair = set_quality(topology, [0, 3])
    cross_socket = set_quality(topology, [1, 4])
    assert (nv2_pair.bottleneck_gbps, cross_socket.bottleneck_gbps) == (50.0, 4.725)
    assert cross_socket.locality == 0.5
    with_leftovers = set_quality(topology, [0, 3], free=range(8))
    assert with_leftovers.leftover_gbps == 50.0
    with pytest.raises(ValueError):
        set_quality(topology, [8])


def test_gpus_of_unknown_model_still_place() -> None:
    topology = NodeTopology(gpus=(Gpu(0), Gpu(1)))  # no links recorded at all
    assert placed(state(topology), WholeGpus(2)).score.bottleneck_gbps == 0.0
