"""What a container is given for its grants: environment variables and mounts. Pure.

- `NVIDIA_VISIBLE_DEVICES`: the GPU UUIDs (or MIG UUIDs), in GPU index order, so that CUDA
  ordinal i inside the container (with `CUDA_DEVICE_ORDER=PCI_BUS_ID`) is the i-th grant.
- Shares additionally get the MPS client caps `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`
  (`<ordinal>=<MiB>M,...`) and `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` (which only take effect
  under an MPS daemon), Linkpack's own `LINKPACK_MEMORY_LIMIT_MIB` / `LINKPACK_MEMORY_FRACTION`
  (one value per visible device, comma-separated; 0 = no cap) read by the framework shim, and the shim
  itself: its host directory mounted read-only at /opt/linkpack/shim and put on PYTHONPATH.
- Every container gets `LINKPACK_ENFORCEMENT`: how strictly its limits are held.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from node_agent.deviceplugin.inventory import Inventory
from topology.allocation import Enforcement, enforcement_for
from topology.workload import GpuGrant

SHIM_CONTAINER_PATH = "/opt/linkpack/shim"

ENV_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
ENV_DEVICE_ORDER = "CUDA_DEVICE_ORDER"
ENV_MPS_MEMORY_LIMIT = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
ENV_MPS_THREAD_PERCENTAGE = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
ENV_MPS_PIPE_DIRECTORY = "CUDA_MPS_PIPE_DIRECTORY"
ENV_MEMORY_LIMIT_MIB = "LINKPACK_MEMORY_LIMIT_MIB"
ENV_MEMORY_FRACTION = "LINKPACK_MEMORY_FRACTION"
ENV_ENFORCEMENT = "LINKPACK_ENFORCEMENT"
ENV_PYTHONPATH = "PYTHONPATH"


@dataclass(frozen=True, slots=True)
class SharingConfig:
    """How this node enforces shares.

    `shim_host_dir`: host directory holding the shim (sitecustomize.py, linkpack_shim.py); None
    leaves the shim out. `mps_pipe_dir`: the MPS control daemon's pipe directory when one runs
    for this node's GPUs (mounted at the same path and exported as CUDA_MPS_PIPE_DIRECTORY).
    """

    shim_host_dir: str | None = None
    mps_pipe_dir: str | None = None

    @property
    def mps_enabled(self) -> bool:
        return self.mps_pipe_dir is not None


@dataclass(frozen=True, slots=True)
class MountSpec:
    container_path: str
    host_path: str
    read_only: bool = True


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """What goes into a ContainerAllocateResponse."""

    envs: tuple[tuple[str, str], ...]
    mounts: tuple[MountSpec, ...] = ()
    enforcement: Enforcement = Enforcement.NONE

    def env(self, name: str) -> str | None:
        return dict(self.envs).get(name)


def container_spec(grants: Sequence[GpuGrant], inventory: Inventory, sharing: SharingConfig) -> ContainerSpec:
    ordered = sorted(grants, key=lambda g: (g.index, g.uuid, g.mig_uuid))
    enforcement = enforcement_for(ordered, sharing.mps_enabled)
    envs: dict[str, str] = {
        ENV_VISIBLE_DEVICES: ",".join(g.mig_uuid or g.uuid for g in ordered),
        ENV_DEVICE_ORDER: "PCI_BUS_ID",
        ENV_ENFORCEMENT: enforcement.value,
    }
    mounts: list[MountSpec] = []
    shares = [g for g in ordered if not g.whole and not g.mig_uuid]
    if shares and len(shares) == len(ordered):
        envs.update(_share_envs(shares, inventory))
        if sharing.shim_host_dir:
            mounts.append(MountSpec(SHIM_CONTAINER_PATH, sharing.shim_host_dir, read_only=True))
            envs[ENV_PYTHONPATH] = SHIM_CONTAINER_PATH
        if sharing.mps_pipe_dir:
            mounts.append(MountSpec(sharing.mps_pipe_dir, sharing.mps_pipe_dir, read_only=False))
            envs[ENV_MPS_PIPE_DIRECTORY] = sharing.mps_pipe_dir
    return ContainerSpec(tuple(sorted(envs.items())), tuple(mounts), enforcement)


def memory_fraction(granted_mib: int, total_mib: int) -> str:
    """The granted part of a GPU's memory, rounded down to 6 decimals so it never exceeds the grant."""
    if total_mib <= 0 or granted_mib <= 0:
        return "0"
    fraction = min(1.0, math.floor(granted_mib * 1_000_000 / total_mib) / 1_000_000)
    return f"{fraction:.6f}".rstrip("0").rstrip(".")


def _share_envs(shares: Sequence[GpuGrant], inventory: Inventory) -> dict[str, str]:
    limits: list[str] = []
    fractions: list[str] = []
    pinned: list[str] = []
    percentages: list[int] = []
    for ordinal, g in enumerate(shares):
        gpu = inventory.gpu(g.uuid)
        total = gpu.memory_mib if gpu else 0
        memory = g.memory_mib  # 0: the record reserves no memory, so none is capped
        limits.append(str(memory))
        fractions.append(memory_fraction(memory, total))
        if memory > 0:
            pinned.append(f"{ordinal}={memory}M")
        if g.units > 0:
            percentages.append(max(1, min(100, g.units * 100 // inventory.units_per_gpu)))
    envs = {ENV_MEMORY_LIMIT_MIB: ",".join(limits), ENV_MEMORY_FRACTION: ",".join(fractions)}
    if pinned:
        envs[ENV_MPS_MEMORY_LIMIT] = ",".join(pinned)
    if percentages:
        # one value for the whole client; the smallest share is the one that must not be exceeded
        envs[ENV_MPS_THREAD_PERCENTAGE] = str(min(percentages))
    return envs
