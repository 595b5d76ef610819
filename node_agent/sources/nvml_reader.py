"""What GPU discovery and health need from NVML, in our own frozen types.

`NvmlReader` is the seam between the agent and the NVIDIA management library. Two things
implement it: `nvml_pynvml.PynvmlReader` (the real library through nvidia-ml-py) and
`nvml_simulated.SimulatedNvml` (answers from a recorded topology). Neither hands out NVML
handles or NVML exceptions: callers see GPU indices, the dataclasses below and `NvmlError`.

Conventions every implementation keeps:
- a fact the device does not support is returned as its "unsupported" value (None, an empty
  tuple, `MigMode.UNSUPPORTED`, `EccCounts()`), never raised; the driver facts and power limits
  (`cuda_driver_version`, `power_limits`) are also "unknown" ("" / `PowerLimits()`) when the
  agent has no permission to read them;
- any other failure raises `NvmlReadError` naming the call and the GPU;
- a library or driver that cannot be loaded at all raises `NvmlUnavailable` when opening.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import Protocol

from topology.model import LinkKind, MigDevice, MigMode

_CUDA_VERSION_RE = re.compile(r"([0-9]{1,4})\.([0-9]{1,4})")


class NvmlError(Exception):
    """Base of every NVML failure the agent can see."""


class NvmlUnavailable(NvmlError):
    """NVML cannot be used on this machine (no library, no driver, no permission)."""


class NvmlReadError(NvmlError):
    """One NVML call failed. `gpu_lost` is set when the driver reports the GPU gone."""

    def __init__(self, call: str, detail: str, *, gpu: int | None = None, gpu_lost: bool = False) -> None:
        where = f" on GPU {gpu}" if gpu is not None else ""
        super().__init__(f"{call}{where}: {detail}")
        self.call = call
        self.gpu = gpu
        self.gpu_lost = gpu_lost


class P2PCapability(IntEnum):
    """Which peer-to-peer capability to ask about (values are NVML's caps indices)."""

    READ = 0
    WRITE = 1
    NVLINK = 2
    ATOMICS = 3
    PCI = 4


class P2PStatus(StrEnum):
    OK = "ok"
    CHIPSET_NOT_SUPPORTED = "chipset not supported"
    GPU_NOT_SUPPORTED = "gpu not supported"
    TOPOLOGY_NOT_SUPPORTED = "topology not supported"
    DISABLED_BY_REGKEY = "disabled by regkey"
    NOT_SUPPORTED = "not supported"
    UNKNOWN = "unknown"


#: NVML's P2P status codes, in order.
P2P_STATUS_BY_CODE: tuple[P2PStatus, ...] = (
    P2PStatus.OK,
    P2PStatus.CHIPSET_NOT_SUPPORTED,
    P2PStatus.GPU_NOT_SUPPORTED,
    P2PStatus.TOPOLOGY_NOT_SUPPORTED,
    P2PStatus.DISABLED_BY_REGKEY,
    P2PStatus.NOT_SUPPORTED,
    P2PStatus.UNKNOWN,
)


class RemoteDeviceType(StrEnum):
    """What sits at the far end of an NVLink."""

    GPU = "gpu"
    IBMNPU = "ibmnpu"
    SWITCH = "switch"
    UNKNOWN = "unknown"


#: NVML topology levels (`nvmlDeviceGetTopologyCommonAncestor`) as our link kinds.
LINK_KIND_BY_NVML_LEVEL: dict[int, LinkKind] = {
    0: LinkKind.INTERNAL,
    10: LinkKind.PIX,
    20: LinkKind.PXB,
    30: LinkKind.PHB,
    40: LinkKind.NODE,
    50: LinkKind.SYS,
}

#: NVML's NVLink version enum value -> NVLink generation (1.0 -> 1, 2.0/2.2 -> 2, 3.0/3.1 -> 3 ...).
NVLINK_GENERATION_BY_VERSION: dict[int, int] = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5, 8: 6}
#: The inverse, using the first enum value of each generation.
NVLINK_VERSION_BY_GENERATION: dict[int, int] = {1: 1, 2: 2, 3: 4, 4: 6, 5: 7, 6: 8}


@dataclass(frozen=True, slots=True)
class DeviceIdentity:
    """Who a GPU is. Memory figures are bytes, as NVML reports them."""

    index: int
    uuid: str
    name: str
    memory_total_bytes: int
    memory_used_bytes: int
    pci_bus_id: str  # NVML form, e.g. "00000000:17:00.0"

    @property
    def memory_total_mib(self) -> int:
        return self.memory_total_bytes // (1024 * 1024)


@dataclass(frozen=True, slots=True)
class Affinity:
    """Where a GPU sits relative to the CPUs. Unknown parts are None / empty."""

    numa_node: int | None
    cpulist: str  # Linux cpulist, e.g. "0-23,48-71"
    gpu_numa_id: int | None = None  # NUMA node of the GPU's own memory (coherent platforms only)


@dataclass(frozen=True, slots=True)
class NvLinkInfo:
    """One NVLink of one GPU. `version` is NVML's enum value, not the generation."""

    link: int
    active: bool
    version: int = 0
    remote_pci_bus_id: str = ""
    remote_type: RemoteDeviceType = RemoteDeviceType.UNKNOWN

    @property
    def generation(self) -> int:
        return NVLINK_GENERATION_BY_VERSION.get(self.version, 0)


@dataclass(frozen=True, slots=True)
class MigInfo:
    """MIG state of one GPU and the instances carved from it (empty unless enabled)."""

    mode: MigMode = MigMode.UNSUPPORTED
    devices: tuple[MigDevice, ...] = ()


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A process holding GPU memory. `used_memory_bytes` is None when NVML cannot tell."""

    pid: int
    used_memory_bytes: int | None


@dataclass(frozen=True, slots=True)
class Utilization:
    gpu_percent: int
    memory_percent: int


@dataclass(frozen=True, slots=True)
class EccCounts:
    """ECC error counters and row-remapping state; None means the GPU does not report it."""

    volatile_corrected: int | None = None
    volatile_uncorrected: int | None = None
    aggregate_corrected: int | None = None
    aggregate_uncorrected: int | None = None
    remap_pending: bool | None = None
    remap_failed: bool | None = None

    @property
    def supported(self) -> bool:
        return any(
            v is not None
            for v in (
                self.volatile_corrected,
                self.volatile_uncorrected,
                self.aggregate_corrected,
                self.aggregate_uncorrected,
                self.remap_pending,
                self.remap_failed,
            )
        )


class EventKind(StrEnum):
    XID = "xid"
    DOUBLE_BIT_ECC = "double-bit-ecc"
    SINGLE_BIT_ECC = "single-bit-ecc"


@dataclass(frozen=True, slots=True)
class XidEvent:
    """A critical event from the driver. `xid` is 0 for ECC events, which carry no XID."""

    gpu_index: int
    kind: EventKind
    xid: int = 0
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass(frozen=True, slots=True)
class PowerLimits:
    """A GPU's power limit now, the range it may be set within and its default, in whole watts.

    0 means NVML could not tell (the GPU does not support power management, or the agent may
    not ask); `known` says whether the limit itself was read."""

    limit_w: int = 0
    min_w: int = 0
    max_w: int = 0
    default_w: int = 0

    @property
    def known(self) -> bool:
        return self.limit_w > 0


class NvmlReader(Protocol):
    """Read-only view of NVML by GPU index. See the module docstring for the error rules."""

    @property
    def source(self) -> str:
        """A short name for where the facts come from, e.g. "nvml" or "nvml (simulated)"."""
        ...

    def driver_version(self) -> str: ...

    def cuda_driver_version(self) -> str:
        """The highest CUDA version the driver runs, "MAJOR.MINOR" (e.g. "12.4"); "" when unknown."""
        ...

    def power_limits(self, index: int) -> PowerLimits:
        """The GPU's power limit and range; `PowerLimits()` when NVML cannot tell."""
        ...

    def set_power_limit(self, index: int, watts: int) -> None:
        """Set the GPU's power limit (needs root); `NvmlReadError` when NVML refuses."""
        ...

    def device_count(self) -> int: ...

    def identity(self, index: int) -> DeviceIdentity: ...

    def affinity(self, index: int) -> Affinity: ...

    def topology_level(self, a: int, b: int) -> LinkKind:
        """The PCIe common ancestor of two distinct GPUs (never `LinkKind.NV`)."""
        ...

    def p2p_status(self, a: int, b: int, capability: P2PCapability) -> P2PStatus: ...

    def nvlinks(self, index: int) -> tuple[NvLinkInfo, ...]:
        """Every NVLink the GPU has (active or not), by link number; empty without NVLink."""
        ...

    def mig(self, index: int) -> MigInfo: ...

    def processes(self, index: int) -> tuple[GpuProcess, ...]:
        """Compute processes on the GPU (all MIG instances included)."""
        ...

    def utilization(self, index: int) -> Utilization | None: ...

    def ecc(self, index: int) -> EccCounts: ...

    def wait_event(self, timeout_ms: int) -> XidEvent | None:
        """Block up to `timeout_ms` for the next XID/ECC event; None when none came."""
        ...

    def close(self) -> None: ...


def cpulist_from_mask_words(words: Sequence[int], bits_per_word: int = 64) -> str:
    """Turn NVML's affinity bitmask (bit b of word w = CPU w*64+b) into a Linux cpulist."""
    cpus = [
        w * bits_per_word + b for w, word in enumerate(words) for b in range(bits_per_word) if word >> b & 1
    ]
    return cpulist_from_cpus(cpus)


def cpulist_from_cpus(cpus: Sequence[int]) -> str:
    """Collapse CPU numbers into "0-3,8,10-11" form (sorted, ranges merged)."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def lowest_set_bit(words: Sequence[int], bits_per_word: int = 64) -> int | None:
    """The first set bit of a multi-word mask (the NUMA node of a node mask), None if empty."""
    for w, word in enumerate(words):
        if word:
            return w * bits_per_word + ((word & -word).bit_length() - 1)
    return None


def cuda_version_text(code: int) -> str:
    """NVML's CUDA version number as "MAJOR.MINOR" (12040 -> "12.4"); "" for none (0 or less)."""
    if code <= 0:
        return ""
    return f"{code // 1000}.{code % 1000 // 10}"


def parse_cuda_version(text: str) -> tuple[int, int] | None:
    """ "MAJOR.MINOR" as numbers; None unless it is exactly two whole numbers."""
    match = _CUDA_VERSION_RE.fullmatch(text.strip())
    return (int(match.group(1)), int(match.group(2))) if match else None


def normalize_bus_id(bus_id: str) -> str:
    """NVML and sysfs spell bus ids differently; compare them as `DDDDDDDD:BB:DD.F` upper-case."""
    text = bus_id.strip().upper()
    domain, sep, rest = text.partition(":")
    if not sep or rest.count(":") != 1:
        return text
    return f"{int(domain, 16):08X}:{rest}" if all(c in "0123456789ABCDEF" for c in domain) else text
