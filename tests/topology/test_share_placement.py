"""GPU shares go where they strand the least capacity, and never beyond a GPU's capacity."""

from __future__ import annotations

import pytest

from tests.support.machines import a100_pcie_nv12_pairs, a100_sxm_mig_pair, hgx_h100, state
from topology.fragmentation import TypicalRequest
from topology.model import Gpu, NodeTopology
from topology.placement import apply_placement, place
from topology.scheduling import GpuShare, GpuUsage, Misfit, MisfitReason, NodeState, Placement
from topology.share_placement import place_share


def with_usage(node: NodeState, index: int, memory_mib: int = 0, units: int = 0) -> NodeState:
    usage = list(node.usage)
    usage[index] = GpuUsage(memory_used_mib=memory_mib, units_used=units)
    return NodeState(node.name, node.topology, tuple(usage), node.units_per_gpu)


def share_gpu(node: NodeState, request: GpuShare) -> int:
    outcome = place(node, request)
    assert isinstance(outcome, Placement), outcome
    assert len(outcome.grants) == 1
    return outcome.gpus[0]


def test_a_share_goes_to_an_already_shared_gpu_so_whole_gpus_stay_free() -> None:
    node = with_usage(state(hgx_h100()), 5, memory_mib=10_000, units=30)
    assert share_gpu(node, GpuShare(memory_mib=8_000, units=20)) == 5


def test_the_grant_carries_exactly_the_share_asked() -> None:
    outcome = place(state(hgx_h100()), GpuShare(memory_mib=4096, units=25))
    assert isinstance(outcome, Placement)
    grant = outcome.grants[0]
    assert (grant.whole, grant.memory_mib, grant.units, grant.uuid) == (False, 4096, 25, "GPU-hgx-h100-0")


def test_an_idle_gpu_for_a_share_is_the_one_that_breaks_no_nvlink_pair() -> None:
    node = state(a100_pcie_nv12_pairs(), used=(0,))
    assert share_gpu(node, GpuShare(units=10)) == 2


def test_fgd_worked_example_small_task_keeps_the_half_free_gpu_for_the_half_task() -> None:
    # fgd.md §2.3: free <0.5, 1.0>, workload {0.3, 0.5, 0.7}: 0.3 goes to the idle GPU B,
    # then 0.5 fills GPU A exactly.
    topology = NodeTopology(gpus=(Gpu(0, "GPU-a", memory_mib=16384), Gpu(1, "GPU-b", memory_mib=16384)))
    node = with_usage(state(topology), 0, units=50)
    workload = tuple(TypicalRequest(milli, 1, 0, 0, 1 / 3) for milli in (300, 500, 700))
    first = place_share(node, GpuShare(units=30), workload)
    assert isinstance(first, Placement) and first.gpus == (1,)
    second = place_share(apply_placement(node, first), GpuShare(units=50), workload)
    assert isinstance(second, Placement) and second.gpus == (0,)


def test_among_shared_gpus_the_tighter_fit_wins_when_fragmentation_ties() -> None:
    node = with_usage(with_usage(state(hgx_h100()), 1, units=40), 2, units=60)
    assert share_gpu(node, GpuShare(units=40)) == 2


def test_filling_a_node_with_shares_never_exceeds_memory_or_units() -> None:
    node = state(hgx_h100())
    requests = [GpuShare(memory_mib=7000 + 1000 * (i % 5), units=5 + 7 * (i % 4)) for i in range(200)]
    for request in requests:
        outcome = place(node, request)
        if isinstance(outcome, Misfit):
            assert outcome.resolvable
            continue
        node = apply_placement(node, outcome)
    for index, usage in enumerate(node.usage):
        assert usage.units_used <= node.units_per_gpu
        assert usage.memory_used_mib <= node.topology.gpus[index].memory_mib


def test_whole_gpus_and_mig_gpus_never_take_shares() -> None:
    node = state(hgx_h100(), used=range(7))
    assert share_gpu(node, GpuShare(units=10)) == 7
    mig = place(state(a100_sxm_mig_pair()), GpuShare(units=10))
    assert isinstance(mig, Misfit) and mig.reason is MisfitReason.NO_GPUS


SHARE_MISFITS = [
    pytest.param(state(hgx_h100()), GpuShare(), MisfitReason.INVALID_REQUEST, False, id="empty share"),
    pytest.param(state(hgx_h100()), GpuShare(units=-1), MisfitReason.INVALID_REQUEST, False, id="negative"),
    pytest.param(
        state(hgx_h100()),
        GpuShare(memory_mib=200_000),
        MisfitReason.GPU_MEMORY_TOO_SMALL,
        False,
        id="too big",
    ),
    pytest.param(
        state(hgx_h100()), GpuShare(units=150), MisfitReason.NOT_ENOUGH_UNITS, False, id="units > GPU"
    ),
    pytest.param(
        state(hgx_h100(), unhealthy=range(8)),
        GpuShare(units=1),
        MisfitReason.ALL_GPUS_UNHEALTHY,
        True,
        id="sick",
    ),
    pytest.param(
        state(hgx_h100(), used=range(8)),
        GpuShare(memory_mib=1, units=1),
        MisfitReason.NOT_ENOUGH_MEMORY_AND_UNITS,
        True,
        id="all held whole",
    ),
]


@pytest.mark.parametrize(("node", "request_", "reason", "resolvable"), SHARE_MISFITS)
def test_share_misfits(node: NodeState, request_: GpuShare, reason: MisfitReason, resolvable: bool) -> None:
    outcome = place(node, request_)
    assert isinstance(outcome, Misfit)
    assert (outcome.reason, outcome.resolvable) == (reason, resolvable)


def _one_gpu_left(memory_used: int, units_used: int) -> NodeState:
    node = state(hgx_h100(), used=range(1, 8))
    return with_usage(node, 0, memory_mib=memory_used, units=units_used)


def test_short_of_memory_only() -> None:
    outcome = place(_one_gpu_left(80_000, 10), GpuShare(memory_mib=4096, units=10))
    assert isinstance(outcome, Misfit) and outcome.reason is MisfitReason.NOT_ENOUGH_MEMORY


def test_short_of_units_only() -> None:
    outcome = place(_one_gpu_left(1000, 95), GpuShare(memory_mib=4096, units=10))
    assert isinstance(outcome, Misfit) and outcome.reason is MisfitReason.NOT_ENOUGH_UNITS


def test_memory_on_one_gpu_and_units_on_another_is_not_enough() -> None:
    node = state(hgx_h100(), used=range(2, 8))
    node = with_usage(with_usage(node, 0, memory_mib=80_000, units=0), 1, memory_mib=0, units=100)
    outcome = place(node, GpuShare(memory_mib=4096, units=10))
    assert isinstance(outcome, Misfit) and outcome.reason is MisfitReason.NOT_ENOUGH_MEMORY_AND_UNITS
