"""Turn recorded allocations into per-GPU usage, and check them against capacity.

The extender rebuilds every node's state from the allocations stored in the API with these
functions; the same check proves, in tests, that what the API holds never exceeds a GPU.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from topology.model import NodeTopology
from topology.scheduling import GpuGrant, GpuUsage, NodeState, PowerLimit


@dataclass(frozen=True, slots=True)
class Overcommit:
    """A GPU holds more than it has: always a bug somewhere, reported with the numbers."""

    gpu: int
    detail: str


#: The usage of a GPU nothing is granted on, by (healthy, cordoned): one shared value each.
_IDLE = {(h, c): GpuUsage(healthy=h, cordoned=c) for h in (True, False) for c in (True, False)}


def accumulate(
    topology: NodeTopology,
    grants: Iterable[GpuGrant],
    units_per_gpu: int,
    unhealthy: frozenset[int] = frozenset(),
    cordoned: frozenset[int] = frozenset(),
) -> tuple[tuple[GpuUsage, ...], tuple[Overcommit, ...]]:
    """Per-GPU usage from `grants` (marked unhealthy and cordoned as given), plus every way in
    which it exceeds a GPU's capacity."""
    whole = [0] * topology.gpu_count
    memory = [0] * topology.gpu_count
    units = [0] * topology.gpu_count
    sharers = [0] * topology.gpu_count
    power = [0] * topology.gpu_count
    migs: list[set[str]] = [set() for _ in topology.gpus]
    problems: list[Overcommit] = []
    for grant in grants:
        i = grant.index
        if not 0 <= i < topology.gpu_count:
            problems.append(Overcommit(i, f"grant names GPU {i}, the node has {topology.gpu_count}"))
            continue
        power[i] += grant.power_w
        if grant.whole:
            whole[i] += 1
        elif grant.mig_uuid:
            if grant.mig_uuid in migs[i]:
                problems.append(Overcommit(i, f"MIG instance {grant.mig_uuid} granted twice"))
            migs[i].add(grant.mig_uuid)
        else:
            memory[i] += grant.memory_mib
            units[i] += grant.units
            sharers[i] += 1
    usage = []
    for i, gpu in enumerate(topology.gpus):
        shared = memory[i] > 0 or units[i] > 0 or bool(migs[i])
        if whole[i] > 1 or (whole[i] and shared):
            problems.append(Overcommit(i, f"GPU {i} held whole {whole[i]}x and shared={shared}"))
        if gpu.memory_mib and memory[i] > gpu.memory_mib:
            problems.append(Overcommit(i, f"GPU {i}: {memory[i]} MiB granted of {gpu.memory_mib} MiB"))
        if units[i] > units_per_gpu:
            problems.append(Overcommit(i, f"GPU {i}: {units[i]} share units granted of {units_per_gpu}"))
        healthy, held_back = i not in unhealthy, i in cordoned
        if whole[i] == memory[i] == units[i] == sharers[i] == power[i] == 0 and not migs[i]:
            usage.append(_IDLE[healthy, held_back])  # equal to the GpuUsage below, shared
            continue
        usage.append(
            GpuUsage(
                whole=whole[i] > 0,
                memory_used_mib=memory[i],
                units_used=units[i],
                mig_used=frozenset(migs[i]),
                healthy=healthy,
                cordoned=held_back,
                sharers=sharers[i],
                power_used_w=power[i],
            )
        )
    return tuple(usage), tuple(problems)


def node_state_from_grants(
    name: str,
    topology: NodeTopology,
    grants: Iterable[GpuGrant],
    units_per_gpu: int,
    unhealthy: frozenset[int] = frozenset(),
    cordoned: frozenset[int] = frozenset(),
    power: tuple[PowerLimit | None, ...] = (),
) -> tuple[NodeState, tuple[Overcommit, ...]]:
    """A node's state from its topology, its recorded grants and its health and cordons."""
    marked, problems = accumulate(topology, grants, units_per_gpu, unhealthy, cordoned)
    if power and len(power) != topology.gpu_count:
        power = ()  # a published list that does not match the GPUs is as good as none
    return NodeState(name, topology, marked, units_per_gpu, power), problems


def with_grants(node: NodeState, grants: Iterable[GpuGrant]) -> NodeState:
    """`node` with `grants` added on top (health and cordons kept); no capacity check."""
    usage = list(node.usage)
    for g in grants:
        u = usage[g.index]
        usage[g.index] = GpuUsage(
            whole=u.whole or g.whole,
            memory_used_mib=u.memory_used_mib + g.memory_mib,
            units_used=u.units_used + g.units,
            mig_used=u.mig_used | ({g.mig_uuid} if g.mig_uuid else set()),
            healthy=u.healthy,
            cordoned=u.cordoned,
            sharers=u.sharers + (0 if g.whole or g.mig_uuid else 1),
            power_used_w=u.power_used_w + g.power_w,
        )
    return NodeState(node.name, node.topology, tuple(usage), node.units_per_gpu, node.power)
