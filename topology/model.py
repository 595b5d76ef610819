"""Frozen data types for one node's GPU topology.

Everything here is plain data: parsers and discovery adapters build these values at the
edge, and the rest of the core (graph, scoring, placement, codec) only reads them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property


class LinkKind(StrEnum):
    """How two devices are connected, in the words of the `nvidia-smi topo -m` legend.

    Ordered from closest to farthest; `NV` is an NVLink bond whose width is carried separately.
    `INTERNAL` is NVML's same-board level (dual-GPU boards), which `topo -m` never prints.
    """

    NV = "NV"
    INTERNAL = "INTERNAL"
    PIX = "PIX"
    PXB = "PXB"
    PHB = "PHB"
    NODE = "NODE"
    SYS = "SYS"

    @property
    def pcie_rank(self) -> int:
        """Closeness on the PCIe tree: higher is closer (NVML level ladder, inverted)."""
        return _PCIE_RANK[self]


_PCIE_RANK = {
    LinkKind.NV: 6,
    LinkKind.INTERNAL: 5,
    LinkKind.PIX: 4,
    LinkKind.PXB: 3,
    LinkKind.PHB: 2,
    LinkKind.NODE: 1,
    LinkKind.SYS: 0,
}


class MigMode(StrEnum):
    DISABLED = "disabled"
    ENABLED = "enabled"
    UNSUPPORTED = "unsupported"


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG instance carved out of a physical GPU."""

    uuid: str
    profile: str  # e.g. "1g.10gb"
    gpu_instance_id: int
    compute_instance_id: int
    memory_mib: int


@dataclass(frozen=True, slots=True)
class Gpu:
    """One physical GPU as discovery sees it. Unknown facts are empty / None, never guessed."""

    index: int
    uuid: str = ""
    model: str = ""
    memory_mib: int = 0
    pci_bus_id: str = ""
    numa_node: int | None = None
    cpu_affinity: str = ""  # Linux cpulist, e.g. "0-23,48-71"
    gpu_numa_id: int | None = None
    mig_mode: MigMode = MigMode.UNSUPPORTED
    mig_devices: tuple[MigDevice, ...] = ()


@dataclass(frozen=True, slots=True)
class Nic:
    """An RDMA NIC seen in the topology (`NIC0` alias with its device name, e.g. `mlx5_0`)."""

    index: int
    name: str


@dataclass(frozen=True, slots=True)
class GpuLink:
    """The connection between GPUs `a` < `b`. `nvlinks` is 0 unless kind is NV."""

    a: int
    b: int
    kind: LinkKind
    nvlinks: int = 0

    def __post_init__(self) -> None:
        if self.a >= self.b:
            raise ValueError(f"GpuLink endpoints must be ordered a < b, got {self.a}, {self.b}")
        if (self.kind is LinkKind.NV) != (self.nvlinks > 0):
            raise ValueError(f"GpuLink {self.a}-{self.b}: kind {self.kind.value} with nvlinks={self.nvlinks}")


@dataclass(frozen=True, slots=True)
class NicLink:
    """The PCIe relation between GPU `gpu` and NIC `nic`."""

    gpu: int
    nic: int
    kind: LinkKind


@dataclass(frozen=True)
class NodeTopology:
    """Everything known about one node's GPUs and how they are wired.

    `gpu_links` holds one entry for every unordered GPU pair. `sources` says where each
    kind of fact came from (e.g. {"links": "nvidia-smi topo -m", "memory": "nvml"}).
    """

    gpus: tuple[Gpu, ...]
    gpu_links: tuple[GpuLink, ...] = ()
    nics: tuple[Nic, ...] = ()
    nic_links: tuple[NicLink, ...] = ()
    nvswitch: bool = False
    sources: tuple[tuple[str, str], ...] = ()
    warnings: tuple[str, ...] = field(default=(), compare=False)

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    def link(self, a: int, b: int) -> GpuLink:
        """The link between two distinct GPUs (order does not matter)."""
        lo, hi = (a, b) if a < b else (b, a)
        return self._link_table[(lo, hi)]

    @cached_property
    def _link_table(self) -> dict[tuple[int, int], GpuLink]:
        return {(lk.a, lk.b): lk for lk in self.gpu_links}


_CPULIST_RE = re.compile(r"^[0-9]{1,6}(-[0-9]{1,6})?(,[0-9]{1,6}(-[0-9]{1,6})?)*$")
#: Linux numbers CPUs and NUMA nodes far below this; a larger one is a damaged list.
MAX_CPU = 65535


def parse_cpulist(text: str) -> frozenset[int]:
    """Expand a Linux cpulist ("0-3,8") into CPU numbers; raises ValueError when malformed."""
    text = text.strip()
    if not text:
        return frozenset()
    if not _CPULIST_RE.match(text):
        raise ValueError(f"not a cpulist: {text!r}")
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        start, end = int(lo), int(hi or lo)
        if end < start:
            raise ValueError(f"cpulist range runs backwards: {part!r}")
        if end > MAX_CPU:
            raise ValueError(f"cpulist number {end} is above {MAX_CPU}: {part!r}")
        cpus.update(range(start, end + 1))
    return frozenset(cpus)
