"""Placing a GPU share: which single GPU strands the least capacity for future requests.

The choice minimises, in order:

1. the fragmentation delta of the node under a typical workload — the FGD paper's
   statistical measure from `topology.fragmentation` (expected free GPU capacity, in
   milli-GPU, that a request drawn from the workload cannot use; a GPU's free share is the
   scarcer of its free units and free memory);
2. using an idle GPU at all (already-shared GPUs first, so whole GPUs stay free);
3. for an idle GPU, the damage to the whole-GPU sets the remaining free GPUs can form
   (the best ring a pair can still form, then how well every free GPU can still pair);
4. the slack left on the GPU (best fit: share units, then memory);
5. the GPU index.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from topology import fragmentation as fgd
from topology.gpu_sets import BANDWIDTH_SCALE, link_table, mask_of, members_of
from topology.model import MigMode
from topology.scheduling import (
    GpuGrant,
    GpuShare,
    Misfit,
    MisfitReason,
    NodeState,
    Placement,
    ScoreBreakdown,
)

_ROUNDING = 6  # decimal places kept when comparing fragmentation values (milli-GPU)


def shares_allowed(node: NodeState, index: int) -> bool:
    """GPUs in MIG mode hand out MIG instances only, never whole or as shares."""
    return node.topology.gpus[index].mig_mode is not MigMode.ENABLED


def place_share(
    node: NodeState,
    request: GpuShare,
    workload: fgd.Workload = fgd.DEFAULT_WORKLOAD,
    max_sharers: int = 0,
) -> Placement | Misfit:
    """One GPU for `request`, or why none fits (see the module docstring for the choice).
    `max_sharers` > 0 leaves out GPUs that already hold that many shares."""
    misfit = _share_misfit(node, request)
    if misfit is not None:
        return misfit
    if request.power_w and (not node.power or any(p is None for p in node.power)):
        return Misfit(MisfitReason.POWER_UNKNOWN, False, f"the share asks for {request.power_w} W")
    if request.power_w and all(p is not None and p.limit_w < request.power_w for p in node.power):
        return Misfit(
            MisfitReason.POWER_OUT_OF_RANGE, False, f"{request.power_w} W asked, above every GPU's limit"
        )
    room = [i for i in _candidates(node) if _fits(node, i, request)]
    fits = [i for i in room if max_sharers <= 0 or node.usage[i].sharers < max_sharers]
    if room and not fits:
        return Misfit(MisfitReason.SHARERS_LIMIT, True, f"{max_sharers} sharers per GPU")
    powered = [i for i in fits if _power_left(node, i) >= request.power_w]
    if fits and not powered:
        return Misfit(MisfitReason.POWER_BUDGET_EXHAUSTED, True, f"{request.power_w} W asked")
    fits = powered
    if not fits:
        return _classify_shortage(node, request)
    free_milli = [fgd.gpu_free_milli(node, i) for i in range(node.topology.gpu_count)]
    model = node.topology.gpus[0].model
    before = fgd.node_fragmentation(tuple(free_milli), None, None, model, workload)
    whole_free = [i for i in node.whole_free() if shares_allowed(node, i)]
    best: tuple[tuple[object, ...], int, float] | None = None
    for index in fits:
        after_milli = list(free_milli)
        after_milli[index] = fgd.gpu_free_milli(_with_share(node, index, request), index)
        after = fgd.node_fragmentation(tuple(after_milli), None, None, model, workload)
        delta = round(after - before, _ROUNDING)
        idle = node.usage[index].idle
        damage = _whole_set_damage(node, whole_free, index) if idle else (0, 0)
        slack = (node.free_units(index) - request.units, node.free_memory_mib(index) - request.memory_mib)
        key = (delta, idle, damage, slack, index)
        if best is None or key < best[0]:
            best = (key, index, delta)
    assert best is not None
    _, index, delta = best
    gpu = node.topology.gpus[index]
    leftover = mask_of(whole_free) & ~(1 << index) if node.usage[index].idle else mask_of(whole_free)
    table = link_table(node.topology)
    leftover_ring = table.best_ring_within(leftover, 2)
    score = ScoreBreakdown(
        bottleneck_gbps=0.0,
        total_pair_gbps=0.0,
        locality=1.0,
        leftover_gbps=leftover_ring / BANDWIDTH_SCALE,
        fragmentation_delta=delta,
        terms=(
            ("shared_gpu", 0.0 if node.usage[index].idle else 1.0),
            ("free_milli_after", float(fgd.gpu_free_milli(_with_share(node, index, request), index))),
            ("whole_free_after", float(len(members_of(leftover)))),
        ),
    )
    grant = GpuGrant(
        index,
        gpu.uuid,
        whole=False,
        memory_mib=request.memory_mib,
        units=request.units,
        power_w=request.power_w,
    )
    return Placement(node.name, (index,), (grant,), score)


def _share_misfit(node: NodeState, request: GpuShare) -> Misfit | None:
    if request.memory_mib < 0 or request.units < 0 or (request.memory_mib == 0 and request.units == 0):
        return Misfit(
            MisfitReason.INVALID_REQUEST, False, "a share needs positive memory and/or units, none negative"
        )
    topology = node.topology
    if topology.gpu_count == 0:
        return Misfit(MisfitReason.NO_GPUS, False)
    capable = [i for i in range(topology.gpu_count) if shares_allowed(node, i)]
    if not capable:
        return Misfit(MisfitReason.NO_GPUS, False, "every GPU is in MIG mode")
    if request.units > node.units_per_gpu:
        return Misfit(
            MisfitReason.NOT_ENOUGH_UNITS,
            False,
            f"{request.units} units asked, a GPU has {node.units_per_gpu}",
        )
    largest = max(topology.gpus[i].memory_mib for i in capable)
    if request.memory_mib > largest:
        return Misfit(
            MisfitReason.GPU_MEMORY_TOO_SMALL,
            False,
            f"{request.memory_mib} MiB asked, the largest GPU has {largest} MiB",
        )
    if not any(node.usage[i].usable for i in capable):
        return Misfit(MisfitReason.ALL_GPUS_UNHEALTHY, True)
    return None


def _power_left(node: NodeState, index: int) -> int:
    """Watts of the GPU's limit not yet promised to its sharers (unbounded when unknown)."""
    limit = node.power_limit(index)
    if limit is None:
        return 1 << 62
    return limit.limit_w - node.usage[index].power_used_w


def _candidates(node: NodeState) -> list[int]:
    return [
        i
        for i, usage in enumerate(node.usage)
        if usage.usable and not usage.whole and not usage.mig_used and shares_allowed(node, i)
    ]


def _fits(node: NodeState, index: int, request: GpuShare) -> bool:
    return node.free_memory_mib(index) >= request.memory_mib and node.free_units(index) >= request.units


def _classify_shortage(node: NodeState, request: GpuShare) -> Misfit:
    candidates = _candidates(node)
    memory_somewhere = any(node.free_memory_mib(i) >= request.memory_mib for i in candidates)
    units_somewhere = any(node.free_units(i) >= request.units for i in candidates)
    if memory_somewhere and not units_somewhere:
        reason = MisfitReason.NOT_ENOUGH_UNITS
    elif units_somewhere and not memory_somewhere:
        reason = MisfitReason.NOT_ENOUGH_MEMORY
    else:
        reason = MisfitReason.NOT_ENOUGH_MEMORY_AND_UNITS
    detail = f"{request.memory_mib} MiB and {request.units} units asked"
    return Misfit(reason, True, detail)


def _with_share(node: NodeState, index: int, request: GpuShare) -> NodeState:
    usage = list(node.usage)
    current = usage[index]
    usage[index] = replace(
        current,
        memory_used_mib=current.memory_used_mib + request.memory_mib,
        units_used=current.units_used + request.units,
        sharers=current.sharers + 1,
        power_used_w=current.power_used_w + request.power_w,
    )
    return NodeState(node.name, node.topology, tuple(usage), node.units_per_gpu)


def _whole_set_damage(node: NodeState, whole_free: Sequence[int], index: int) -> tuple[int, int]:
    """How much worse the free whole GPUs can pair once `index` is taken (lower is better)."""
    table = link_table(node.topology)
    leftover = mask_of(whole_free) & ~(1 << index)
    return (-table.best_ring_within(leftover, 2), -table.leftover_pairs(members_of(leftover)))
