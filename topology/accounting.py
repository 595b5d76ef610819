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
    count = topology.gpu_count
    touched: dict[int, list[int]] = {}  # GPU → [whole, memory, units, sharers, power]
    migs: dict[int, set[str]] = {}
    problems: list[Overcommit] = []
    for grant in grants:
        i = grant.index
        if not 0 <= i < count:
            problems.append(Overcommit(i, f"grant names GPU {i}, the node has {count}"))
            continue
        sums = touched.get(i)
        if sums is None:
            sums = touched[i] = [0, 0, 0, 0, 0]
        sums[4] += grant.power_w
        if grant.whole:
            sums[0] += 1
        elif grant.mig_uuid:
            held = migs.setdefault(i, set())
            if grant.mig_uuid in held:
                problems.append(Overcommit(i, f"MIG instance {grant.mig_uuid} granted twice"))
            held.add(grant.mig_uuid)
        else:
            sums[1] += grant.memory_mib
            sums[2] += grant.units
            sums[3] += 1
    usage = []
    for i, gpu in enumerate(topology.gpus):
        healthy, held_back = i not in unhealthy, i in cordoned
        sums = touched.get(i)
        mig = migs.get(i, set())
        if sums is None or (not any(sums) and not mig):
            usage.append(_IDLE[healthy, held_back])  # equal to the GpuUsage below, shared
            continue
        whole, memory, units, sharers, power = sums
        shared = memory > 0 or units > 0 or bool(mig)
        if whole > 1 or (whole and shared):
            problems.append(Overcommit(i, f"GPU {i} held whole {whole}x and shared={shared}"))
        if gpu.memory_mib and memory > gpu.memory_mib:
            problems.append(Overcommit(i, f"GPU {i}: {memory} MiB granted of {gpu.memory_mib} MiB"))
        if units > units_per_gpu:
            problems.append(Overcommit(i, f"GPU {i}: {units} share units granted of {units_per_gpu}"))
        usage.append(
            GpuUsage(
                whole=whole > 0,
                memory_used_mib=memory,
                units_used=units,
                mig_used=frozenset(mig),
                healthy=healthy,
                cordoned=held_back,
                sharers=sharers,
                power_used_w=power,
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
