"""What a policy requires of a placement: GPU models, NVSwitch, one NUMA node, sharers per GPU."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.support.machines import hgx_h100, rtx3090_two_socket, state
from topology.accounting import with_grants
from topology.placement import place
from topology.scheduling import GpuShare, Misfit, MisfitReason, NodeState, Placement, Policy, WholeGpus

pytestmark = pytest.mark.timeout(30)


def _empty(topology) -> NodeState:  # type: ignore[no-untyped-def]
    return NodeState.empty("n", topology)


def test_a_model_outside_the_policy_is_never_used() -> None:
    """A policy allowing only H100s refuses a node of 3090s for good, naming both."""
    policy = Policy("h100-only", allowed_models=("NVIDIA H100 80GB HBM3",))
    outcome = place(_empty(rtx3090_two_socket()), WholeGpus(1), policy)
    assert isinstance(outcome, Misfit) and outcome.reason is MisfitReason.MODEL_NOT_ALLOWED
    assert not outcome.resolvable and "h100-only" in outcome.message
    hgx = hgx_h100()
    allowed = Policy(
        "hgx", allowed_models=(hgx.gpus[0].model.lower(),)
    )  # model names compare case-insensitively
    assert isinstance(place(_empty(hgx), WholeGpus(2), allowed), Placement)


def test_nvswitch_required_refuses_pcie_nodes() -> None:
    """Requiring NVSwitch makes a PCIe node unresolvable and leaves an NVSwitch node as it was."""
    policy = Policy("fabric", require_nvswitch=True)
    outcome = place(_empty(rtx3090_two_socket()), WholeGpus(2), policy)
    assert (
        isinstance(outcome, Misfit) and outcome.reason is MisfitReason.NO_NVSWITCH and not outcome.resolvable
    )
    assert isinstance(place(_empty(hgx_h100()), WholeGpus(2), policy), Placement)


def test_same_numa_keeps_a_set_inside_one_socket() -> None:
    """On two sockets of four GPUs, 4 GPUs fit in one socket; once a GPU of each socket is taken,
    a 4-GPU set would have to cross sockets, which the policy refuses (resolvable: it may free up)."""
    topology = rtx3090_two_socket()
    policy = Policy("numa", require_same_numa=True)
    found = place(_empty(topology), WholeGpus(4), policy)
    assert isinstance(found, Placement)
    assert len({topology.gpus[i].numa_node for i in found.gpus}) == 1
    first = topology.gpus[0]
    other = next(g for g in topology.gpus if g.numa_node != first.numa_node)
    both = state(topology, used=(first.index, other.index))
    refused = place(both, WholeGpus(4), policy)
    assert (
        isinstance(refused, Misfit) and refused.reason is MisfitReason.NO_SAME_NUMA_SET and refused.resolvable
    )
    assert isinstance(place(both, WholeGpus(4)), Placement)  # without the policy the set crosses sockets


def test_sharers_per_gpu_are_capped() -> None:
    """With at most two sharers per GPU, a third share goes to another GPU, and a one-GPU node
    whose GPU already has two sharers refuses (resolvable)."""
    topology = hgx_h100()
    policy = Policy("two-per-gpu", max_sharers_per_gpu=2)
    state = _empty(topology)
    placed: list[int] = []
    for _ in range(3):
        outcome = place(state, GpuShare(memory_mib=1024, units=10), policy)
        assert isinstance(outcome, Placement)
        placed.append(outcome.gpus[0])
        state = with_grants(state, outcome.grants)
    assert placed[0] == placed[1] != placed[2]
    assert max(u.sharers for u in state.usage) == 2
    single = replace(topology, gpus=topology.gpus[:1], gpu_links=())
    one = _empty(single)
    for _ in range(2):
        one = with_grants(one, place(one, GpuShare(memory_mib=1024, units=10), policy).grants)  # type: ignore[union-attr]
    refused = place(one, GpuShare(memory_mib=1024, units=10), policy)
    assert isinstance(refused, Misfit) and refused.reason is MisfitReason.SHARERS_LIMIT and refused.resolvable
