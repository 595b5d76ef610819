"""Where a request goes on one node: `place`, and applying or releasing what it decided.

- `WholeGpus(k)`: the best k free GPUs by ring bottleneck, pair bandwidth, locality and what
  the choice leaves behind (`topology.gpu_sets` defines the order; `topology.oracle` checks it).
- `GpuShare`: the single GPU that strands the least capacity (`topology.share_placement`).
- `MigSlice`: a free MIG instance of the profile, on a GPU already partly used when possible.

Everything here is a pure function of immutable snapshots; ties break deterministically.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from topology import fragmentation as fgd
from topology.gpu_sets import (
    BANDWIDTH_SCALE,
    BestSet,
    LinkTable,
    SetKey,
    best_set,
    link_table,
    nic_closeness,
    set_key,
)
from topology.model import LinkKind, MigMode, NodeTopology
from topology.scheduling import (
    GpuGrant,
    GpuShare,
    MigSlice,
    Misfit,
    MisfitReason,
    NodeState,
    Placement,
    Policy,
    Request,
    ScoreBreakdown,
    WholeGpus,
)
from topology.share_placement import place_share, shares_allowed

DEFAULT_POLICY = Policy()
_PIX_RANK = LinkKind.PIX.pcie_rank  # a NIC behind the same PCIe switch counts as fully close


def place(
    node: NodeState,
    request: Request,
    policy: Policy = DEFAULT_POLICY,
    workload: fgd.Workload = fgd.DEFAULT_WORKLOAD,
) -> Placement | Misfit:
    """Place `request` on `node`, or say why it does not fit. `workload` is the typical workload a
    share's GPU is chosen against (the fleet's learned one, where the caller knows it)."""
    refused = policy_misfit(node, policy)
    if refused is not None:
        return refused
    if isinstance(request, WholeGpus):
        return place_whole_gpus(node, request, policy)
    if isinstance(request, GpuShare):
        return place_share(node, request, workload, max_sharers=policy.max_sharers_per_gpu)
    if isinstance(request, MigSlice):
        return place_mig_slice(node, request)
    raise TypeError(f"unknown request type {type(request).__name__}")


def policy_misfit(node: NodeState, policy: Policy) -> Misfit | None:
    """Why a node can never serve pods of this policy (GPU model, NVSwitch), or None."""
    topology = node.topology
    if policy.allowed_models:
        models = sorted({g.model for g in topology.gpus})
        allowed = {m.lower() for m in policy.allowed_models}
        if not models or any(m.lower() not in allowed for m in models):
            return Misfit(
                MisfitReason.MODEL_NOT_ALLOWED,
                False,
                f"{', '.join(models) or 'unknown model'} not in policy {policy.name}'s "
                f"{', '.join(policy.allowed_models)}",
            )
    if policy.require_nvswitch and not topology.nvswitch:
        return Misfit(MisfitReason.NO_NVSWITCH, False, f"policy {policy.name}")
    return None


# ----------------------------------------------------------------------------- whole GPUs


def whole_gpu_candidates(node: NodeState) -> tuple[int, ...]:
    """GPUs that may be handed out whole now: usable, idle and not in MIG mode (ascending)."""
    return tuple(i for i in node.whole_free() if shares_allowed(node, i))


def place_whole_gpus(
    node: NodeState, request: WholeGpus, policy: Policy = DEFAULT_POLICY
) -> Placement | Misfit:
    k = request.count
    topology = node.topology
    if k < 1:
        return Misfit(MisfitReason.INVALID_REQUEST, False, f"asked for {k} GPUs")
    if topology.gpu_count == 0:
        return Misfit(MisfitReason.NO_GPUS, False)
    eligible = [i for i in range(topology.gpu_count) if shares_allowed(node, i)]
    if len(eligible) < k:
        return Misfit(MisfitReason.TOO_FEW_GPUS, False, f"{k} asked, the node has {len(eligible)}")
    nic_ranks: tuple[int, ...] | None = None
    if request.near_nic is not None:
        nic_ranks = nic_closeness(topology, request.near_nic)
        if nic_ranks is None:
            return Misfit(MisfitReason.NIC_NOT_FOUND, False, request.near_nic)
    if request.power_w:
        in_range = _power_settable(node, eligible, request.power_w)
        if isinstance(in_range, Misfit):
            return in_range
        eligible = in_range
    usable = [i for i in eligible if node.usage[i].usable]
    if not usable:
        return Misfit(MisfitReason.ALL_GPUS_UNHEALTHY, True)
    allowed = set(eligible)
    free = [i for i in whole_gpu_candidates(node) if i in allowed]
    if len(free) < k:
        held_back = len(eligible) - len(usable)
        detail = f"{k} asked, {len(free)} free" + (
            f", {held_back} unhealthy or cordoned" if held_back else ""
        )
        return Misfit(MisfitReason.TOO_FEW_FREE_GPUS, True, detail)
    table = link_table(topology)
    if policy.require_same_numa and k >= 2:
        within = _best_within_one_numa_node(table, node, free, eligible, k, nic_ranks)
        if isinstance(within, Misfit):
            return within
        found: BestSet | None = within
    else:
        found = best_set(table, free, k, nic_ranks)
    assert found is not None
    threshold = round(policy.min_bottleneck_gbps * BANDWIDTH_SCALE)
    if k >= 2 and found.key.ring < threshold:
        best_anywhere = table.best_ring_within(_mask(eligible), k)
        return Misfit(
            MisfitReason.NO_SET_WITH_LINK_QUALITY,
            best_anywhere >= threshold,
            f"best free set reaches {found.key.ring / BANDWIDTH_SCALE:g} GB/s, "
            f"{policy.min_bottleneck_gbps:g} GB/s required",
        )
    grants = tuple(
        GpuGrant(i, topology.gpus[i].uuid, whole=True, power_w=request.power_w) for i in found.gpus
    )
    score = _breakdown(
        found.key, len(found.gpus), nic_ranks is not None, _fragmentation_delta(node, found.gpus)
    )
    return Placement(node.name, found.gpus, grants, score)


def _power_settable(node: NodeState, eligible: list[int], watts: int) -> list[int] | Misfit:
    """The GPUs whose power limit may be set to `watts` (a whole GPU's budget), or why none."""
    limits = [node.power_limit(i) for i in eligible]
    if any(limit is None or limit.max_w <= 0 for limit in limits):  # no range: cannot tell it is settable
        return Misfit(MisfitReason.POWER_UNKNOWN, False, f"the pod asks for {watts} W per GPU")
    settable = [
        i for i, limit in zip(eligible, limits, strict=True) if limit and limit.min_w <= watts <= limit.max_w
    ]
    if settable:
        return settable
    ranges = sorted({(limit.min_w, limit.max_w) for limit in limits if limit})
    shown = ", ".join(f"{lo}-{hi} W" for lo, hi in ranges)
    return Misfit(MisfitReason.POWER_OUT_OF_RANGE, False, f"{watts} W asked, the GPUs allow {shown}")


def _best_within_one_numa_node(
    table: LinkTable,
    node: NodeState,
    free: Sequence[int],
    eligible: Sequence[int],
    k: int,
    nic_ranks: Sequence[int] | None,
) -> BestSet | Misfit:
    """The best free set inside a single NUMA node (GPUs of unknown NUMA node are left out)."""
    gpus = node.topology.gpus
    groups = sorted({numa for i in eligible if (numa := gpus[i].numa_node) is not None})
    best: BestSet | None = None
    for numa in groups:
        found = best_set(table, [i for i in free if gpus[i].numa_node == numa], k, nic_ranks)
        if found is not None and (best is None or _key_tuple(found.key) > _key_tuple(best.key)):
            best = found
    if best is not None:
        return best
    possible = any(sum(1 for i in eligible if gpus[i].numa_node == numa) >= k for numa in groups)
    return Misfit(MisfitReason.NO_SAME_NUMA_SET, possible, f"{k} GPUs in one NUMA node")


def _key_tuple(key: SetKey) -> tuple[int, ...]:
    return (
        key.ring,
        key.pair_total,
        key.nic_rank_sum,
        key.negative_numa_nodes,
        key.leftover_ring,
        key.leftover_pairs,
    )


def set_quality(
    topology: NodeTopology,
    gpus: Iterable[int],
    free: Iterable[int] | None = None,
    near_nic: str | None = None,
) -> ScoreBreakdown:
    """The quality terms of an arbitrary GPU set (for ranking nodes, debugging and tests).

    `free` is the set of free GPUs the choice is taken out of (default: `gpus` only, so
    nothing is left over); `near_nic` adds NIC closeness to the locality term.
    """
    chosen = sorted(set(gpus))
    if any(not 0 <= i < topology.gpu_count for i in chosen):
        raise ValueError(f"GPU index out of range in {chosen} (node has {topology.gpu_count})")
    pool = sorted(set(chosen) | set(free or ()))
    nic_ranks = nic_closeness(topology, near_nic) if near_nic is not None else None
    key = set_key(link_table(topology), chosen, pool, nic_ranks)
    return _breakdown(key, len(chosen), nic_ranks is not None, 0.0)


def _breakdown(key: SetKey, size: int, near_nic: bool, fragmentation_delta: float) -> ScoreBreakdown:
    numa_nodes = -key.negative_numa_nodes
    numa_locality = 1.0 / max(1, numa_nodes)
    terms: list[tuple[str, float]] = [
        ("numa_nodes", float(numa_nodes)),
        ("leftover_pair_gbps", key.leftover_pairs / BANDWIDTH_SCALE),
    ]
    locality = numa_locality
    if near_nic:
        closeness = min(1.0, key.nic_rank_sum / (_PIX_RANK * size)) if size else 0.0
        terms.append(("nic_closeness", round(closeness, 6)))
        locality = (numa_locality + closeness) / 2
    return ScoreBreakdown(
        bottleneck_gbps=key.ring / BANDWIDTH_SCALE,
        total_pair_gbps=key.pair_total / BANDWIDTH_SCALE,
        locality=round(locality, 6),
        leftover_gbps=key.leftover_ring / BANDWIDTH_SCALE,
        fragmentation_delta=round(fragmentation_delta, 9),
        terms=tuple(terms),
    )


def _fragmentation_delta(node: NodeState, taken: tuple[int, ...]) -> float:
    """How much the FGD fragmentation of the node (milli-GPU) grows when `taken` go whole."""
    before = tuple(fgd.gpu_free_milli(node, i) for i in range(node.topology.gpu_count))
    after = tuple(0 if i in taken else free for i, free in enumerate(before))
    model = node.topology.gpus[0].model
    workload = fgd.DEFAULT_WORKLOAD
    return fgd.node_fragmentation(after, None, None, model, workload) - fgd.node_fragmentation(
        before, None, None, model, workload
    )


def _mask(indices: Iterable[int]) -> int:
    mask = 0
    for i in indices:
        mask |= 1 << i
    return mask


# ----------------------------------------------------------------------------- MIG


def place_mig_slice(node: NodeState, request: MigSlice) -> Placement | Misfit:
    """A free MIG instance of the profile; GPUs already partly used first, then tighter ones."""
    if not request.profile:
        return Misfit(MisfitReason.INVALID_REQUEST, False, "empty MIG profile")
    gpus = node.topology.gpus
    offering = [
        g.index
        for g in gpus
        if g.mig_mode is MigMode.ENABLED and any(d.profile == request.profile for d in g.mig_devices)
    ]
    if not offering:
        return Misfit(MisfitReason.NO_MIG_PROFILE, False, request.profile)
    usable = [i for i in offering if node.usage[i].usable]
    if not usable:
        return Misfit(MisfitReason.ALL_GPUS_UNHEALTHY, True, f"every GPU offering {request.profile}")
    best: tuple[tuple[int, int, int], int] | None = None
    for i in usable:
        usage = node.usage[i]
        if usage.whole:
            continue
        free = [
            d for d in gpus[i].mig_devices if d.profile == request.profile and d.uuid not in usage.mig_used
        ]
        if not free:
            continue
        key = (0 if usage.mig_used else 1, len(free), i)
        if best is None or key < best[0]:
            best = (key, i)
    if best is None:
        return Misfit(MisfitReason.MIG_PROFILE_EXHAUSTED, True, request.profile)
    index = best[1]
    gpu = gpus[index]
    device = min(
        (
            d
            for d in gpu.mig_devices
            if d.profile == request.profile and d.uuid not in node.usage[index].mig_used
        ),
        key=lambda d: (d.gpu_instance_id, d.compute_instance_id, d.uuid),
    )
    grant = GpuGrant(index, gpu.uuid, whole=False, mig_uuid=device.uuid)
    score = ScoreBreakdown(terms=(("gpu_partly_used", 1.0 - best[0][0]),))
    return Placement(node.name, (index,), (grant,), score)


# ----------------------------------------------------------------------------- apply / release


def apply_placement(node: NodeState, placement: Placement) -> NodeState:
    """The node after `placement` is granted; ValueError when it would over-allocate a GPU."""
    usage = list(node.usage)
    for grant in _checked_grants(node, placement):
        current = usage[grant.index]
        where = f"node {node.name} GPU {grant.index}"
        if grant.whole:
            if not current.idle:
                raise ValueError(f"{where}: granted whole but it is already in use")
            usage[grant.index] = replace(
                current, whole=True, power_used_w=current.power_used_w + grant.power_w
            )
        elif grant.mig_uuid:
            known = {d.uuid for d in node.topology.gpus[grant.index].mig_devices}
            if grant.mig_uuid not in known:
                raise ValueError(f"{where}: has no MIG instance {grant.mig_uuid}")
            if current.whole or grant.mig_uuid in current.mig_used:
                raise ValueError(f"{where}: MIG instance {grant.mig_uuid} is already taken")
            usage[grant.index] = replace(current, mig_used=current.mig_used | {grant.mig_uuid})
        else:
            memory = current.memory_used_mib + grant.memory_mib
            units = current.units_used + grant.units
            capacity = node.topology.gpus[grant.index].memory_mib
            if current.whole or units > node.units_per_gpu or (capacity and memory > capacity):
                raise ValueError(
                    f"{where}: share of {grant.memory_mib} MiB / {grant.units} units does not fit "
                    f"({current.memory_used_mib} MiB / {current.units_used} units used, whole={current.whole})"
                )
            usage[grant.index] = replace(
                current,
                memory_used_mib=memory,
                units_used=units,
                sharers=current.sharers + 1,
                power_used_w=current.power_used_w + grant.power_w,
            )
    return NodeState(node.name, node.topology, tuple(usage), node.units_per_gpu, node.power)


def release_placement(node: NodeState, placement: Placement) -> NodeState:
    """The node after `placement` is given back; ValueError when it was not held."""
    usage = list(node.usage)
    for grant in _checked_grants(node, placement):
        current = usage[grant.index]
        where = f"node {node.name} GPU {grant.index}"
        if grant.whole:
            if not current.whole:
                raise ValueError(f"{where}: released whole but it is not held whole")
            usage[grant.index] = replace(
                current, whole=False, power_used_w=max(0, current.power_used_w - grant.power_w)
            )
        elif grant.mig_uuid:
            if grant.mig_uuid not in current.mig_used:
                raise ValueError(f"{where}: MIG instance {grant.mig_uuid} is not taken")
            usage[grant.index] = replace(current, mig_used=current.mig_used - {grant.mig_uuid})
        else:
            memory = current.memory_used_mib - grant.memory_mib
            units = current.units_used - grant.units
            if memory < 0 or units < 0:
                raise ValueError(f"{where}: releases more than is held ({memory} MiB, {units} units left)")
            usage[grant.index] = replace(
                current,
                memory_used_mib=memory,
                units_used=units,
                sharers=max(0, current.sharers - 1),
                power_used_w=max(0, current.power_used_w - grant.power_w),
            )
    return NodeState(node.name, node.topology, tuple(usage), node.units_per_gpu, node.power)


def _checked_grants(node: NodeState, placement: Placement) -> tuple[GpuGrant, ...]:
    if placement.node != node.name:
        raise ValueError(f"placement is for node {placement.node!r}, not {node.name!r}")
    for grant in placement.grants:
        if not 0 <= grant.index < node.topology.gpu_count:
            raise ValueError(f"grant names GPU {grant.index}, node {node.name} has {node.topology.gpu_count}")
        if grant.memory_mib < 0 or grant.units < 0:
            raise ValueError(f"grant on GPU {grant.index} has negative memory or units")
    return placement.grants
