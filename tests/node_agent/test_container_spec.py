"""What a container's environment and mounts say for each kind of grant."""

from __future__ import annotations

from node_agent.deviceplugin.container_spec import (
    SHIM_CONTAINER_PATH,
    MountSpec,
    SharingConfig,
    container_spec,
    enforcement_for,
    memory_fraction,
)
from topology.allocation import Enforcement

from .builders import GPU_MEMORY_MIB, inventory, mig, mig_uuid, share, uuid, whole

SHIM = SharingConfig(shim_host_dir="/opt/linkpack-host/shim")


def test_enforcement_follows_the_kind_of_grant_and_the_nodes_mps_daemon() -> None:
    assert enforcement_for(whole(0, 1), mps_enabled=True) is Enforcement.NONE
    assert enforcement_for(mig(1, 0), mps_enabled=True) is Enforcement.MIG
    assert enforcement_for(share(0, 100, 1), mps_enabled=True) is Enforcement.MPS
    assert enforcement_for(share(0, 100, 1), mps_enabled=False) is Enforcement.COOPERATIVE


def test_whole_gpus_are_listed_by_uuid_in_index_order_without_caps_or_shim() -> None:
    spec = container_spec(whole(3, 1), inventory(), SHIM)
    assert spec.env("NVIDIA_VISIBLE_DEVICES") == f"{uuid(1)},{uuid(3)}"
    assert spec.env("LINKPACK_ENFORCEMENT") == "none"
    assert spec.env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") is None and spec.env("PYTHONPATH") is None
    assert spec.mounts == ()


def test_mig_instances_are_listed_by_mig_uuid() -> None:
    spec = container_spec(mig(1, 1), inventory(2, mig_gpus=(1,)), SHIM)
    assert spec.env("NVIDIA_VISIBLE_DEVICES") == mig_uuid(1, 1)
    assert spec.env("LINKPACK_ENFORCEMENT") == "mig"


def test_a_share_gets_mps_caps_linkpack_limits_and_the_shim() -> None:
    spec = container_spec(share(2, 20480, 25), inventory(), SHIM)
    assert spec.env("NVIDIA_VISIBLE_DEVICES") == uuid(2)
    assert spec.env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") == "0=20480M"
    assert spec.env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == "25"
    assert spec.env("LINKPACK_MEMORY_LIMIT_MIB") == "20480"
    assert spec.env("LINKPACK_MEMORY_FRACTION") == "0.25"
    assert spec.env("LINKPACK_ENFORCEMENT") == "cooperative"
    assert spec.env("PYTHONPATH") == SHIM_CONTAINER_PATH
    assert spec.mounts == (MountSpec(SHIM_CONTAINER_PATH, "/opt/linkpack-host/shim", read_only=True),)


def test_an_mps_node_adds_the_pipe_directory() -> None:
    sharing = SharingConfig(mps_pipe_dir="/run/nvidia/mps/pipe")
    spec = container_spec(share(0, 1024, 10), inventory(), sharing)
    assert spec.env("LINKPACK_ENFORCEMENT") == "mps"
    assert spec.env("CUDA_MPS_PIPE_DIRECTORY") == "/run/nvidia/mps/pipe"
    assert spec.env("PYTHONPATH") is None  # no shim directory configured
    assert MountSpec("/run/nvidia/mps/pipe", "/run/nvidia/mps/pipe", read_only=False) in spec.mounts


def test_a_units_only_share_caps_no_memory() -> None:
    spec = container_spec(share(0, 0, 50), inventory(), SHIM)
    assert spec.env("LINKPACK_MEMORY_LIMIT_MIB") == "0" and spec.env("LINKPACK_MEMORY_FRACTION") == "0"
    assert spec.env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") is None
    assert spec.env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == "50"


def test_memory_fractions_round_down_and_never_exceed_one() -> None:
    assert memory_fraction(1, 3) == "0.333333"
    assert memory_fraction(GPU_MEMORY_MIB, GPU_MEMORY_MIB) == "1"
    assert memory_fraction(GPU_MEMORY_MIB * 2, GPU_MEMORY_MIB) == "1"
    assert memory_fraction(5, 0) == "0"


def test_envs_are_sorted_for_a_stable_response() -> None:
    spec = container_spec(share(0, 100, 1), inventory(), SHIM)
    names = [k for k, _ in spec.envs]
    assert names == sorted(names)
