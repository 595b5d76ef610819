"""The vocabulary of one scheduling decision: what is asked of a node (requests, policy), what
it already carries (node state, grants) and what placing answers (placements, misfits).

(The fleet's mix of requests that fragmentation is measured against is a different thing:
`topology.fragmentation.Workload`.)

These are the inputs and outputs of `topology.placement.place`; the extender, the node agent
and the cluster simulator all speak in these types.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from topology.model import NodeTopology

#: Share units one whole GPU is divided into, unless a node says otherwise.
DEFAULT_UNITS_PER_GPU = 100


# ----------------------------------------------------------------------------- requests


@dataclass(frozen=True, slots=True)
class WholeGpus:
    """`count` whole GPUs for one pod; `near_nic` asks for GPUs close to that NIC name."""

    count: int
    near_nic: str | None = None
    power_w: int = 0  # the power budget of each GPU, watts (0: none)


@dataclass(frozen=True, slots=True)
class GpuShare:
    """Part of one GPU: `memory_mib` of its memory and/or `units` of its compute share units."""

    memory_mib: int = 0
    units: int = 0
    power_w: int = 0  # the share's power budget on its GPU, watts (0: none)


@dataclass(frozen=True, slots=True)
class MigSlice:
    """One MIG instance of `profile` (e.g. "1g.10gb")."""

    profile: str


Request = WholeGpus | GpuShare | MigSlice


# ----------------------------------------------------------------------------- node state


@dataclass(frozen=True, slots=True)
class GpuUsage:
    """What is taken on one GPU, and whether it may be used at all."""

    whole: bool = False
    memory_used_mib: int = 0
    units_used: int = 0
    mig_used: frozenset[str] = frozenset()  # MIG device UUIDs handed out
    healthy: bool = True
    cordoned: bool = False
    sharers: int = 0  # share grants held on it (pods sharing it)
    power_used_w: int = 0  # power budgets granted on it, watts

    @property
    def usable(self) -> bool:
        return self.healthy and not self.cordoned

    @property
    def idle(self) -> bool:
        """Nothing at all is allocated on it."""
        return not self.whole and self.memory_used_mib == 0 and self.units_used == 0 and not self.mig_used


@dataclass(frozen=True, slots=True)
class PowerLimit:
    """A GPU's power limit now and the range it may be set within, watts."""

    limit_w: int
    min_w: int = 0
    max_w: int = 0


@dataclass(frozen=True)
class NodeState:
    """A node's topology plus what is allocated on each GPU (indexed like `topology.gpus`)."""

    name: str
    topology: NodeTopology
    usage: tuple[GpuUsage, ...]
    units_per_gpu: int = DEFAULT_UNITS_PER_GPU
    power: tuple[PowerLimit | None, ...] = ()  # per GPU, as the node publishes it (empty: unknown)

    def __post_init__(self) -> None:
        if len(self.usage) != self.topology.gpu_count:
            raise ValueError(
                f"node {self.name}: {len(self.usage)} usage entries for {self.topology.gpu_count} GPUs"
            )
        if self.power and len(self.power) != self.topology.gpu_count:
            raise ValueError(
                f"node {self.name}: {len(self.power)} power entries for {self.topology.gpu_count} GPUs"
            )

    def power_limit(self, index: int) -> PowerLimit | None:
        return self.power[index] if self.power else None

    @classmethod
    def empty(
        cls, name: str, topology: NodeTopology, units_per_gpu: int = DEFAULT_UNITS_PER_GPU
    ) -> NodeState:
        return cls(name, topology, tuple(GpuUsage() for _ in topology.gpus), units_per_gpu)

    def free_memory_mib(self, index: int) -> int:
        u = self.usage[index]
        if u.whole:
            return 0
        return max(0, self.topology.gpus[index].memory_mib - u.memory_used_mib)

    def free_units(self, index: int) -> int:
        u = self.usage[index]
        if u.whole:
            return 0
        return max(0, self.units_per_gpu - u.units_used)

    def whole_free(self) -> tuple[int, ...]:
        """GPUs that can be handed out whole right now, ascending."""
        return tuple(i for i, u in enumerate(self.usage) if u.usable and u.idle)


# ----------------------------------------------------------------------------- outcomes


class MisfitReason(StrEnum):
    """Why a request does not fit a node. The value is the operator-facing text."""

    NO_TOPOLOGY = "node has no GPU topology record"
    NO_GPUS = "node has no GPUs"
    TOO_FEW_GPUS = "node has fewer GPUs than requested"
    TOO_FEW_FREE_GPUS = "too few free GPUs"
    NO_SET_WITH_LINK_QUALITY = "no free GPU set with the required link quality"
    GPU_MEMORY_TOO_SMALL = "no GPU on the node has that much memory"
    NOT_ENOUGH_MEMORY = "not enough free memory on any single GPU"
    NOT_ENOUGH_UNITS = "not enough free share units on any single GPU"
    NOT_ENOUGH_MEMORY_AND_UNITS = "no single GPU has both the memory and the share units free"
    ALL_GPUS_UNHEALTHY = "every candidate GPU is unhealthy or cordoned"
    NO_MIG_PROFILE = "no GPU on the node offers that MIG profile"
    MIG_PROFILE_EXHAUSTED = "every MIG instance of that profile is taken"
    NIC_NOT_FOUND = "the node has no NIC of that name"
    INVALID_REQUEST = "the request is not valid"
    MODEL_NOT_ALLOWED = "the policy does not allow this node's GPU model"
    NO_NVSWITCH = "the policy requires NVSwitch and the node has none"
    NO_SAME_NUMA_SET = "no free GPU set within one NUMA node"
    SHARERS_LIMIT = "every GPU with room already has the policy's maximum number of sharers"
    DRIVER_TOO_OLD = "the node's driver is too old for the pod's CUDA version"
    DRIVER_UNKNOWN = "the node does not say which CUDA version its driver runs"
    POWER_UNKNOWN = "the node does not publish its GPUs' power limits"
    POWER_OUT_OF_RANGE = "the GPUs' power limit cannot be set to the pod's budget"
    POWER_BUDGET_EXHAUSTED = "no GPU with room has that much power budget left"


@dataclass(frozen=True, slots=True)
class Misfit:
    """The request does not fit. `resolvable` is False when it can never fit on this node."""

    reason: MisfitReason
    resolvable: bool
    detail: str = ""

    @property
    def message(self) -> str:
        return f"{self.reason.value}: {self.detail}" if self.detail else self.reason.value


@dataclass(frozen=True, slots=True)
class GpuGrant:
    """What one GPU gives a placement: all of it, or memory and units, or one MIG instance."""

    index: int
    uuid: str
    whole: bool
    memory_mib: int = 0
    units: int = 0
    mig_uuid: str = ""
    power_w: int = 0  # the power budget granted on this GPU, watts


@dataclass(frozen=True, slots=True)
class ScoreBreakdown:
    """Why a placement scored as it did; every term is "higher is better" unless named otherwise.

    - `bottleneck_gbps`: the slowest link of the best ring through the set (0 for one GPU).
    - `total_pair_gbps`: the sum of pairwise bandwidth over the set.
    - `locality`: 1.0 when the set sits in one NUMA node / under one root, lower when it spreads.
    - `leftover_gbps`: bottleneck of the best ring the remaining free GPUs could still form.
    - `fragmentation_delta`: how much stranded capacity the choice adds (lower is better).
    """

    bottleneck_gbps: float = 0.0
    total_pair_gbps: float = 0.0
    locality: float = 1.0
    leftover_gbps: float = 0.0
    fragmentation_delta: float = 0.0
    terms: tuple[tuple[str, float], ...] = field(default=())


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a request goes on one node: the GPUs (ascending) and what each one gives."""

    node: str
    gpus: tuple[int, ...]
    grants: tuple[GpuGrant, ...]
    score: ScoreBreakdown


Outcome = Placement | Misfit


# ----------------------------------------------------------------------------- policy


class PolicyName(StrEnum):
    BALANCED = "balanced"
    BINPACK = "binpack"
    SPREAD = "spread"


@dataclass(frozen=True, slots=True)
class Policy:
    """How to weigh the terms when choosing a node (prioritize) and a share GPU, and what a
    placement must satisfy at all.

    - `min_bottleneck_gbps`: a multi-GPU request fails when no free set reaches that rate;
    - `require_nvswitch`: only nodes with NVSwitch;
    - `require_same_numa`: a multi-GPU set must sit in one NUMA node;
    - `allowed_models`: only nodes whose GPUs are one of these models (empty: any);
    - `max_sharers_per_gpu`: a share goes only to a GPU with fewer sharers (0: no limit);
    - `spread`: prefer emptier nodes instead of fuller ones (the packing term inverted).
    """

    name: str = PolicyName.BALANCED.value
    weight_link_quality: float = 1.0
    weight_fragmentation: float = 1.0
    weight_packing: float = 1.0
    min_bottleneck_gbps: float = 0.0
    require_nvswitch: bool = False
    require_same_numa: bool = False
    allowed_models: tuple[str, ...] = ()
    max_sharers_per_gpu: int = 0
    spread: bool = False
