"""What a container is given for its grants: environment variables and mounts. Pure.

The enforcement is the record's (`Allocation.enforcement`, decided by the extender at bind from
the node's published `mps.active`); this module applies it and does not decide again:

- `NVIDIA_VISIBLE_DEVICES`: the GPU UUIDs (or MIG UUIDs), in GPU index order, so that CUDA
  ordinal i inside the container (with `CUDA_DEVICE_ORDER=PCI_BUS_ID`) is the i-th grant.
- Shares get Linkpack's `LINKPACK_MEMORY_LIMIT_MIB` / `LINKPACK_MEMORY_FRACTION` (one value per
  visible device, comma-separated; 0 = no cap) read by the framework shim, and the shim itself:
  its host directory mounted read-only at /opt/linkpack/shim and put on PYTHONPATH.
- Shares whose record says interposer, on a node where the CUDA interposer library is installed
  (`interposer_ready`), also get the library (its host directory mounted read-only at
  /opt/linkpack/interposer) in `LD_PRELOAD`, with `LINKPACK_COMPUTE_UNITS` (the grant's units per
  visible device), `LINKPACK_UNITS_PER_GPU`, `LINKPACK_COMPUTE_PRIORITY` (the record's priority)
  and, when the node has one, the GPU state directory shared by all share containers
  (`LINKPACK_GPU_STATE_DIR`, mounted read-write at /run/linkpack/gpu-state). The memory cap is the
  shim's `LINKPACK_MEMORY_LIMIT_MIB`, read by both.
- Shares whose record says hard MPS, on a node where MPS serves now (`mps_ready`: a healthy
  supervised control daemon, or an external daemon's pipe directory), also get the MPS client
  caps `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` (`<ordinal>=<MiB>M,...`, ordinals 0..n-1 in
  `NVIDIA_VISIBLE_DEVICES` order) and `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, the pipe directory
  (`CUDA_MPS_PIPE_DIRECTORY`, mounted at the same path), the daemon's shared memory at /dev/shm
  when the node names one, and `CUDA_MPS_CLIENT_PRIORITY` for high (0) and low (1) records.
- Whole GPUs (`none`) and MIG instances (`mig`) get neither `LD_PRELOAD` nor any MPS variable:
  they pass through untouched, so NCCL and multi-GPU programs run as they would without Linkpack.
- Every container gets `LINKPACK_ENFORCEMENT`: the enforcement applied. When that is not what the
  record says (MPS or the interposer unavailable here, or a level the grants cannot have), the
  share is held cooperatively and `ContainerSpec.fallback` and `LINKPACK_ENFORCEMENT_FALLBACK`
  say why.

CUDA MPS knows two client priorities (`CUDA_MPS_CLIENT_PRIORITY`, CUDA 12): 0 normal (the same as
unset) and 1 below normal. There is no level above normal, so a `high` record gets 0 (it is ahead
of the `low` sharers, equal to the `normal` ones) and a `low` record gets 1; `normal` sets nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from contract.allocation import ComputePriority, Enforcement
from node_agent.deviceplugin.inventory import Inventory
from topology.scheduling import GpuGrant

SHIM_CONTAINER_PATH = "/opt/linkpack/shim"
#: where the interposer's host directory is mounted, and the library in it (`LD_PRELOAD`)
INTERPOSER_CONTAINER_DIR = "/opt/linkpack/interposer"
INTERPOSER_LIBRARY = "liblinkpack_cuda.so"
INTERPOSER_CONTAINER_PATH = f"{INTERPOSER_CONTAINER_DIR}/{INTERPOSER_LIBRARY}"
#: the GPU state directory shared by the node's share containers (interposer priority)
GPU_STATE_CONTAINER_PATH = "/run/linkpack/gpu-state"
#: where an MPS control daemon's shared memory goes in its clients
MPS_SHM_CONTAINER_PATH = "/dev/shm"

ENV_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
ENV_DEVICE_ORDER = "CUDA_DEVICE_ORDER"
ENV_MPS_MEMORY_LIMIT = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
ENV_MPS_THREAD_PERCENTAGE = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
ENV_MPS_PIPE_DIRECTORY = "CUDA_MPS_PIPE_DIRECTORY"
ENV_MPS_CLIENT_PRIORITY = "CUDA_MPS_CLIENT_PRIORITY"
ENV_LD_PRELOAD = "LD_PRELOAD"
ENV_COMPUTE_UNITS = "LINKPACK_COMPUTE_UNITS"
ENV_UNITS_PER_GPU = "LINKPACK_UNITS_PER_GPU"
ENV_COMPUTE_PRIORITY = "LINKPACK_COMPUTE_PRIORITY"
ENV_GPU_STATE_DIR = "LINKPACK_GPU_STATE_DIR"

#: CUDA_MPS_CLIENT_PRIORITY by the record's priority: 0 normal (MPS has nothing higher), 1 below normal
MPS_CLIENT_PRIORITY = {ComputePriority.HIGH: "0", ComputePriority.LOW: "1"}
ENV_MEMORY_LIMIT_MIB = "LINKPACK_MEMORY_LIMIT_MIB"
ENV_MEMORY_FRACTION = "LINKPACK_MEMORY_FRACTION"
ENV_ENFORCEMENT = "LINKPACK_ENFORCEMENT"
ENV_ENFORCEMENT_FALLBACK = "LINKPACK_ENFORCEMENT_FALLBACK"
ENV_PYTHONPATH = "PYTHONPATH"


@dataclass(frozen=True, slots=True)
class SharingConfig:
    """How this node serves shares.

    `shim_host_dir`: host directory holding the shim (sitecustomize.py, linkpack_shim.py); None
    leaves the shim out. `mps_pipe_dir`: the MPS control daemon's pipe directory, when one is
    configured (whether MPS serves is checked at each handout, `node_agent.sharing.mps`); `mps_shm_dir`:
    the host directory the daemon has as /dev/shm, mounted there in its clients (None: not
    mounted). `interposer_host_dir`: host directory holding liblinkpack_cuda.so (whether it is
    there is checked at each handout); `gpu_state_dir`: host directory shared read-write by the
    node's share containers for the interposer's priority between sharers (None: no priority).
    """

    shim_host_dir: str | None = None
    mps_pipe_dir: str | None = None
    interposer_host_dir: str | None = None
    gpu_state_dir: str | None = None
    mps_shm_dir: str | None = None


@dataclass(frozen=True, slots=True)
class MountSpec:
    container_path: str
    host_path: str
    read_only: bool = True


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """What goes into a ContainerAllocateResponse; `enforcement` is the one applied, `fallback`
    why it differs from the record's ("" when it does not)."""

    envs: tuple[tuple[str, str], ...]
    mounts: tuple[MountSpec, ...] = ()
    enforcement: Enforcement = Enforcement.NONE
    fallback: str = ""

    def env(self, name: str) -> str | None:
        return dict(self.envs).get(name)


def applied_enforcement(
    recorded: Enforcement, grants: Sequence[GpuGrant], mps_ready: bool, interposer_ready: bool = False
) -> tuple[Enforcement, str]:
    """The enforcement this node applies for a record's grants, and why it is not the record's
    ("" when it is). The record chooses among the levels its grants can have; hard MPS needs MPS
    to serve this node now (`mps_ready`), the interposer its library installed here
    (`interposer_ready`): without them shares are held cooperatively."""
    allowed: tuple[Enforcement, ...]  # the weakest first
    if any(g.mig_uuid for g in grants):
        allowed, what = (Enforcement.MIG,), "MIG instances"
    elif all(not g.whole for g in grants):
        allowed, what = (Enforcement.COOPERATIVE, Enforcement.INTERPOSER, Enforcement.HARD_MPS), "shares"
    else:
        allowed, what = (Enforcement.NONE,), "whole GPUs"
    if recorded not in allowed:
        weakest = allowed[0]
        return (
            weakest,
            f"the record says {recorded.value}, which {what} cannot have; applying {weakest.value}",
        )
    if recorded is Enforcement.HARD_MPS and not mps_ready:
        why = (
            f"the record says {recorded.value}, but MPS does not serve this node now (no MPS pipe "
            "directory, or its control daemon is not healthy); applying cooperative"
        )
        return Enforcement.COOPERATIVE, why
    if recorded is Enforcement.INTERPOSER and not interposer_ready:
        why = (
            "the record says interposer, but the CUDA interposer library is not installed on this node; "
            "applying cooperative"
        )
        return Enforcement.COOPERATIVE, why
    return recorded, ""


def container_spec(
    grants: Sequence[GpuGrant],
    inventory: Inventory,
    sharing: SharingConfig,
    recorded: Enforcement,
    *,
    mps_ready: bool = False,
    interposer_ready: bool = False,
    priority: ComputePriority = ComputePriority.NORMAL,
) -> ContainerSpec:
    """The container's environment and mounts for these grants under the record's enforcement and
    compute priority; `mps_ready`: MPS serves this node now; `interposer_ready`: the interposer
    library is installed in `sharing.interposer_host_dir`."""
    ordered = sorted(grants, key=lambda g: (g.index, g.uuid, g.mig_uuid))
    interposer_ready = interposer_ready and sharing.interposer_host_dir is not None
    enforcement, fallback = applied_enforcement(recorded, ordered, mps_ready, interposer_ready)
    envs: dict[str, str] = {
        ENV_VISIBLE_DEVICES: ",".join(g.mig_uuid or g.uuid for g in ordered),
        ENV_DEVICE_ORDER: "PCI_BUS_ID",
        ENV_ENFORCEMENT: enforcement.value,
    }
    if fallback:
        envs[ENV_ENFORCEMENT_FALLBACK] = fallback
    mounts: list[MountSpec] = []
    if enforcement in (Enforcement.COOPERATIVE, Enforcement.INTERPOSER, Enforcement.HARD_MPS):
        envs.update(_share_envs(ordered, inventory))
        if sharing.shim_host_dir:
            mounts.append(MountSpec(SHIM_CONTAINER_PATH, sharing.shim_host_dir, read_only=True))
            envs[ENV_PYTHONPATH] = SHIM_CONTAINER_PATH
    if enforcement is Enforcement.INTERPOSER and sharing.interposer_host_dir is not None:
        envs.update(_interposer_envs(ordered, inventory, priority))
        mounts.append(MountSpec(INTERPOSER_CONTAINER_DIR, sharing.interposer_host_dir, read_only=True))
        if sharing.gpu_state_dir:
            mounts.append(MountSpec(GPU_STATE_CONTAINER_PATH, sharing.gpu_state_dir, read_only=False))
            envs[ENV_GPU_STATE_DIR] = GPU_STATE_CONTAINER_PATH
    if enforcement is Enforcement.HARD_MPS:
        envs.update(_mps_envs(ordered, inventory))
        if priority is not ComputePriority.NORMAL:
            envs[ENV_MPS_CLIENT_PRIORITY] = MPS_CLIENT_PRIORITY[priority]
        if sharing.mps_pipe_dir:
            mounts.append(MountSpec(sharing.mps_pipe_dir, sharing.mps_pipe_dir, read_only=False))
            envs[ENV_MPS_PIPE_DIRECTORY] = sharing.mps_pipe_dir
        if sharing.mps_shm_dir:
            mounts.append(MountSpec(MPS_SHM_CONTAINER_PATH, sharing.mps_shm_dir, read_only=False))
    return ContainerSpec(tuple(sorted(envs.items())), tuple(mounts), enforcement, fallback)


def memory_fraction(granted_mib: int, total_mib: int) -> str:
    """The granted part of a GPU's memory, rounded down to 6 decimals so it never exceeds the grant."""
    if total_mib <= 0 or granted_mib <= 0:
        return "0"
    fraction = min(1.0, math.floor(granted_mib * 1_000_000 / total_mib) / 1_000_000)
    return f"{fraction:.6f}".rstrip("0").rstrip(".")


def _share_envs(shares: Sequence[GpuGrant], inventory: Inventory) -> dict[str, str]:
    limits: list[str] = []
    fractions: list[str] = []
    for g in shares:
        gpu = inventory.gpu(g.uuid)
        memory = g.memory_mib  # 0: the record reserves no memory, so none is capped
        limits.append(str(memory))
        fractions.append(memory_fraction(memory, gpu.memory_mib if gpu else 0))
    return {ENV_MEMORY_LIMIT_MIB: ",".join(limits), ENV_MEMORY_FRACTION: ",".join(fractions)}


def _interposer_envs(
    shares: Sequence[GpuGrant], inventory: Inventory, priority: ComputePriority
) -> dict[str, str]:
    """What the CUDA interposer reads besides the memory cap it shares with the framework shim."""
    return {
        ENV_LD_PRELOAD: INTERPOSER_CONTAINER_PATH,
        ENV_COMPUTE_UNITS: ",".join(str(g.units) for g in shares),  # 0: no quota on that device
        ENV_UNITS_PER_GPU: str(inventory.units_per_gpu),
        ENV_COMPUTE_PRIORITY: priority.value,
    }


def _mps_envs(shares: Sequence[GpuGrant], inventory: Inventory) -> dict[str, str]:
    pinned = [f"{ordinal}={g.memory_mib}M" for ordinal, g in enumerate(shares) if g.memory_mib > 0]
    percentages = [max(1, min(100, g.units * 100 // inventory.units_per_gpu)) for g in shares if g.units > 0]
    envs: dict[str, str] = {}
    if pinned:
        envs[ENV_MPS_MEMORY_LIMIT] = ",".join(pinned)
    if percentages:
        # one value for the whole client; the smallest share is the one that must not be exceeded
        envs[ENV_MPS_THREAD_PERCENTAGE] = str(min(percentages))
    return envs
