"""The FGD fragmentation measure (Weng et al., USENIX ATC 2023, §3.2, Eq 1-3).

GPU capacity is counted in milli-GPU: every GPU offers 1000, and a node is described by the
free share of each of its GPUs (0..1000), its free CPU and memory, and its GPU model.

A target workload M is a set of typical requests m with popularity p_m. The fragmentation of
node n with respect to M is F_n(M) = Σ_m p_m · F_n(m), where F_n(m) is

- all of the node's idle GPU when m cannot run there (too little CPU, memory or GPU, a GPU
  model m does not accept) or when m needs no GPU at all;
- otherwise the idle GPU on devices whose free share is smaller than min(m's per-GPU share,
  1000): the slivers m could never use.

The unit is milli-GPU, so F is directly comparable with the node's idle capacity. Memory only
counts when a typical request names some (the paper's workloads never do; it keys M on CPU and
GPU alone), so paper-faithful workloads give paper values.

Placement compares candidate nodes by `fragmentation_delta` (F after - F before, lower is
better); `node_state_fragmentation` measures a `NodeState` with the same rule so the
extender's prioritize and the cluster simulator agree.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from topology.model import MigMode
from topology.scheduling import GpuUsage, NodeState

MILLI_PER_GPU = 1000


@dataclass(frozen=True, slots=True)
class TypicalRequest:
    """One request shape of the target workload and its popularity (0..1).

    `gpu_milli` is the share asked of each GPU (1..1000), `gpu_count` how many GPUs; both 0 for
    a CPU-only request. `gpu_models` lists acceptable GPU models; empty means any.
    """

    gpu_milli: int
    gpu_count: int
    cpu_milli: int
    memory_mib: int
    probability: float
    gpu_models: tuple[str, ...] = ()

    @property
    def needs_gpu(self) -> bool:
        return self.gpu_milli > 0 and self.gpu_count > 0


Workload = tuple[TypicalRequest, ...]


@dataclass(frozen=True, slots=True)
class PodShape:
    """What one observed pod asked for; the input from which a target workload is built."""

    cpu_milli: int
    gpu_milli: int
    gpu_count: int
    memory_mib: int = 0
    gpu_models: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeResources:
    """What a node has free. `None` for CPU or memory means "not constrained / unknown"."""

    free_milli_per_gpu: tuple[int, ...]
    free_cpu_milli: int | None = None
    free_memory_mib: int | None = None
    gpu_model: str = ""


# ----------------------------------------------------------------------------- target workload


def typical_workload_from(
    pods: Iterable[PodShape],
    popularity_threshold_percent: float = 95.0,
    include_cpu_only: bool = True,
    key_on_memory: bool = False,
) -> Workload:
    """The target workload M, built the way the paper's simulator builds it (fgd.md §3.3).

    Pods are grouped by (cpu, per-GPU share, GPU count, GPU models) — and memory too when
    `key_on_memory` — and counted. Shapes are taken most popular first (ties: larger CPU, then
    share, count and model string first) until they cover `popularity_threshold_percent` of all
    pods; the kept popularities are renormalised to sum to 1.
    """
    counts: Counter[PodShape] = Counter()
    for pod in pods:
        is_gpu = pod.gpu_count > 0 and pod.gpu_milli > 0
        if not is_gpu and not include_cpu_only:
            continue
        counts[
            PodShape(
                cpu_milli=pod.cpu_milli,
                gpu_milli=min(pod.gpu_milli, MILLI_PER_GPU) if is_gpu else 0,
                gpu_count=pod.gpu_count if is_gpu else 0,
                memory_mib=pod.memory_mib if key_on_memory else 0,
                gpu_models=pod.gpu_models,
            )
        ] += 1
    total = sum(counts.values())
    if total == 0:
        return ()
    ranked = sorted(
        counts.items(),
        key=lambda kv: (
            kv[1],
            kv[0].cpu_milli,
            kv[0].gpu_milli,
            kv[0].gpu_count,
            "|".join(kv[0].gpu_models),
            kv[0].memory_mib,
        ),
        reverse=True,
    )
    wanted = popularity_threshold_percent * total / 100.0
    kept: list[tuple[PodShape, int]] = []
    covered = 0
    for shape, count in ranked:
        if covered >= wanted:
            break
        kept.append((shape, count))
        covered += count
    return tuple(
        TypicalRequest(
            gpu_milli=shape.gpu_milli,
            gpu_count=shape.gpu_count,
            cpu_milli=shape.cpu_milli,
            memory_mib=shape.memory_mib,
            probability=count / covered,
            gpu_models=shape.gpu_models,
        )
        for shape, count in kept
    )


# ----------------------------------------------------------------------------- the measure


def request_fragmentation(
    free_milli_per_gpu: tuple[int, ...],
    free_cpu_milli: int | None,
    free_memory_mib: int | None,
    gpu_model: str,
    request: TypicalRequest,
) -> int:
    """F_n(m) in milli-GPU for one request shape (Eq 2 and 3), ignoring its popularity."""
    idle = sum(free_milli_per_gpu)
    if not request.needs_gpu:
        return idle
    if request.gpu_models and gpu_model not in request.gpu_models:
        return idle
    if free_cpu_milli is not None and free_cpu_milli < request.cpu_milli:
        return idle
    if free_memory_mib is not None and request.memory_mib and free_memory_mib < request.memory_mib:
        return idle
    fitting = sum(1 for free in free_milli_per_gpu if free >= request.gpu_milli)
    if fitting < request.gpu_count:
        return idle
    too_small = min(request.gpu_milli, MILLI_PER_GPU)
    return sum(free for free in free_milli_per_gpu if free < too_small)


def node_fragmentation(
    free_milli_per_gpu: tuple[int, ...],
    free_cpu_milli: int | None,
    free_memory_mib: int | None,
    gpu_model: str,
    workload: Workload,
) -> float:
    """F_n(M) in milli-GPU: the expected idle GPU a request drawn from `workload` cannot use.

    Popularities are used as given (not renormalised). `None` CPU or memory is unconstrained.
    The same sum as `request_fragmentation` over the workload, in the same order, with the
    per-share GPU counts computed once per distinct share.
    """
    idle = sum(free_milli_per_gpu)
    by_share: dict[int, tuple[int, int]] = {}
    total: float = 0
    for request in workload:
        value = idle
        if (
            request.needs_gpu
            and not (request.gpu_models and gpu_model not in request.gpu_models)
            and not (free_cpu_milli is not None and free_cpu_milli < request.cpu_milli)
            and not (
                free_memory_mib is not None and request.memory_mib and free_memory_mib < request.memory_mib
            )
        ):
            share = request.gpu_milli
            found = by_share.get(share)
            if found is None:
                too_small = min(share, MILLI_PER_GPU)
                found = by_share[share] = (
                    sum(1 for free in free_milli_per_gpu if free >= share),
                    sum(free for free in free_milli_per_gpu if free < too_small),
                )
            if found[0] >= request.gpu_count:
                value = found[1]
        total += request.probability * value
    return total


def resources_fragmentation(node: NodeResources, workload: Workload) -> float:
    """`node_fragmentation` of a `NodeResources` snapshot."""
    return node_fragmentation(
        node.free_milli_per_gpu, node.free_cpu_milli, node.free_memory_mib, node.gpu_model, workload
    )


def fragmentation_delta(before: NodeResources, after: NodeResources, workload: Workload) -> float:
    """F(after) - F(before) in milli-GPU; FGD places a pod where this is smallest (it may be < 0)."""
    return resources_fragmentation(after, workload) - resources_fragmentation(before, workload)


# ----------------------------------------------------------------------------- NodeState adapter


def gpu_free_milli(node: NodeState, index: int) -> int:
    """Free share of one GPU, 0..1000: the scarcer of its free share units and free memory.

    A GPU held whole, unhealthy or cordoned has nothing free. A MIG-enabled GPU offers the
    memory share of its MIG instances not yet handed out.
    """
    usage: GpuUsage = node.usage[index]
    gpu = node.topology.gpus[index]
    if usage.whole or not usage.usable:
        return 0
    if gpu.mig_mode is MigMode.ENABLED:
        total = sum(m.memory_mib for m in gpu.mig_devices)
        if total <= 0:
            return 0
        free = sum(m.memory_mib for m in gpu.mig_devices if m.uuid not in usage.mig_used)
        return MILLI_PER_GPU * free // total
    by_units = MILLI_PER_GPU
    if node.units_per_gpu > 0:
        by_units = MILLI_PER_GPU * node.free_units(index) // node.units_per_gpu
    by_memory = MILLI_PER_GPU
    if gpu.memory_mib > 0:
        by_memory = MILLI_PER_GPU * node.free_memory_mib(index) // gpu.memory_mib
    return max(0, min(by_units, by_memory, MILLI_PER_GPU))


def node_resources_from_state(
    node: NodeState, free_cpu_milli: int | None = None, free_memory_mib: int | None = None
) -> NodeResources:
    """A `NodeState` as the measure sees it; the node's model is its first GPU's model."""
    model = node.topology.gpus[0].model if node.topology.gpus else ""
    return NodeResources(
        free_milli_per_gpu=tuple(gpu_free_milli(node, i) for i in range(len(node.usage))),
        free_cpu_milli=free_cpu_milli,
        free_memory_mib=free_memory_mib,
        gpu_model=model,
    )


# GPU request shapes of the openb default trace (Alibaba cluster-trace-gpu-v2023, 7054 GPU
# pods): (per-GPU milli, GPU count, pods). Used as the target workload when none is configured.
_OPENB_DEFAULT_GPU_SHAPES: tuple[tuple[int, int, int], ...] = (
    (1000, 1, 3911),
    (810, 1, 1078),
    (470, 1, 750),
    (320, 1, 328),
    (650, 1, 253),
    (230, 1, 140),
    (460, 1, 128),
    (590, 1, 75),
    (160, 1, 74),
    (550, 1, 72),
    (220, 1, 62),
    (370, 1, 47),
    (1000, 8, 44),
    (110, 1, 24),
    (480, 1, 19),
    (1000, 2, 16),
    (1000, 4, 15),
)


def _default_workload() -> Workload:
    total = sum(pods for _, _, pods in _OPENB_DEFAULT_GPU_SHAPES)
    return tuple(
        TypicalRequest(gpu_milli=milli, gpu_count=count, cpu_milli=0, memory_mib=0, probability=pods / total)
        for milli, count, pods in _OPENB_DEFAULT_GPU_SHAPES
    )


#: GPU-only shapes covering 99.6% of the openb default trace's GPU pods, CPU left out: the
#: measure where nothing better is known, and the prior of the learned workload
#: (`topology.workload_learning`). CPU-only shapes are omitted: they add the same term to
#: every node's delta for a given pod, so they never change a ranking.
DEFAULT_WORKLOAD: Workload = _default_workload()


def node_state_fragmentation(
    node: NodeState,
    workload: Workload = DEFAULT_WORKLOAD,
    free_cpu_milli: int | None = None,
    free_memory_mib: int | None = None,
) -> float:
    """F_n(M) in milli-GPU of a `NodeState` (see `gpu_free_milli` for the per-GPU free share)."""
    return resources_fragmentation(node_resources_from_state(node, free_cpu_milli, free_memory_mib), workload)
