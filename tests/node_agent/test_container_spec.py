"""What a container's environment and mounts say for each kind of grant."""

from __future__ import annotations

from dataclasses import replace

import pytest

from contract.allocation import ComputePriority, Enforcement, enforcement_for
from node_agent.deviceplugin.container_spec import (
    GPU_STATE_CONTAINER_PATH,
    INTERPOSER_CONTAINER_DIR,
    INTERPOSER_CONTAINER_PATH,
    SHIM_CONTAINER_PATH,
    MountSpec,
    SharingConfig,
    applied_enforcement,
    container_spec,
    memory_fraction,
)
from tests.support.device_plugin import GPU_MEMORY_MIB, inventory, mig, mig_uuid, share, uuid, whole

SHIM = SharingConfig(shim_host_dir="/opt/linkpack-host/shim")
MPS = SharingConfig(mps_pipe_dir="/run/nvidia/mps/pipe")
#: a node offering every level: shim, interposer (installed beside the shim), GPU state, MPS
FULL = SharingConfig(
    shim_host_dir="/opt/linkpack-host/shim",
    interposer_host_dir="/opt/linkpack-host/shim/interposer",
    gpu_state_dir="/var/lib/linkpack/gpu-state",
    mps_pipe_dir="/run/nvidia/mps/pipe",
    mps_shm_dir="/var/lib/linkpack/mps/shm",
)
NONE, COOPERATIVE = Enforcement.NONE, Enforcement.COOPERATIVE


def test_the_contract_decides_enforcement_from_the_kind_of_grant_and_the_nodes_mps() -> None:
    """The extender's rule (in the contract) gives MIG, none, hard MPS or cooperative by the kind of grant."""
    assert enforcement_for(whole(0, 1), mps_enabled=True) is Enforcement.NONE
    assert enforcement_for(mig(1, 0), mps_enabled=True) is Enforcement.MIG
    assert enforcement_for(share(0, 100, 1), mps_enabled=True) is Enforcement.HARD_MPS
    assert enforcement_for(share(0, 100, 1), mps_enabled=False) is Enforcement.COOPERATIVE


def test_the_node_applies_the_records_enforcement_and_says_why_when_it_cannot() -> None:
    """The record's level is applied when the grants allow it; hard MPS without a pipe directory becomes cooperative."""
    assert applied_enforcement(Enforcement.HARD_MPS, share(0, 1, 1), mps_ready=True) == (
        Enforcement.HARD_MPS,
        "",
    )
    assert applied_enforcement(COOPERATIVE, share(0, 1, 1), mps_ready=True) == (COOPERATIVE, "")
    applied, why = applied_enforcement(Enforcement.HARD_MPS, share(0, 1, 1), mps_ready=False)
    assert applied is COOPERATIVE and "no MPS pipe directory" in why
    applied, why = applied_enforcement(NONE, share(0, 1, 1), mps_ready=True)
    assert applied is COOPERATIVE and "shares cannot have" in why
    assert applied_enforcement(Enforcement.HARD_MPS, whole(0), mps_ready=True)[0] is NONE
    assert applied_enforcement(NONE, mig(1, 0), mps_ready=True)[0] is Enforcement.MIG


def test_whole_gpus_are_listed_by_uuid_in_index_order_without_caps_or_shim() -> None:
    """Whole GPUs are listed by UUID in index order and get no caps, no shim and no mounts."""
    spec = container_spec(whole(3, 1), inventory(), SHIM, NONE)
    assert spec.env("NVIDIA_VISIBLE_DEVICES") == f"{uuid(1)},{uuid(3)}"
    assert spec.env("LINKPACK_ENFORCEMENT") == "none" and spec.fallback == ""
    assert spec.env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") is None and spec.env("PYTHONPATH") is None
    assert spec.mounts == ()


def test_mig_instances_are_listed_by_mig_uuid() -> None:
    """A MIG grant is listed by its MIG UUID and enforced by the hardware."""
    spec = container_spec(mig(1, 1), inventory(2, mig_gpus=(1,)), SHIM, Enforcement.MIG)
    assert spec.env("NVIDIA_VISIBLE_DEVICES") == mig_uuid(1, 1)
    assert spec.env("LINKPACK_ENFORCEMENT") == "mig"


def test_a_cooperative_share_gets_linkpack_limits_and_the_shim_but_no_mps_env() -> None:
    """A share recorded as cooperative gets the shim and Linkpack's caps, and none of the MPS variables."""
    spec = container_spec(share(2, 20480, 25), inventory(), SHIM, COOPERATIVE, mps_ready=True)
    assert spec.env("NVIDIA_VISIBLE_DEVICES") == uuid(2)
    assert spec.env("LINKPACK_MEMORY_LIMIT_MIB") == "20480"
    assert spec.env("LINKPACK_MEMORY_FRACTION") == "0.25"
    assert spec.env("LINKPACK_ENFORCEMENT") == "cooperative"
    assert spec.env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") is None
    assert spec.env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") is None
    assert spec.env("PYTHONPATH") == SHIM_CONTAINER_PATH
    assert spec.mounts == (MountSpec(SHIM_CONTAINER_PATH, "/opt/linkpack-host/shim", read_only=True),)


def test_an_mps_share_on_an_mps_node_gets_the_client_caps_and_the_pipe_directory() -> None:
    """A share recorded as MPS, on a node with the pipe directory, gets the MPS caps and the pipe mount."""
    spec = container_spec(share(0, 20480, 25), inventory(), MPS, Enforcement.HARD_MPS, mps_ready=True)
    assert spec.env("LINKPACK_ENFORCEMENT") == "hard-mps" and spec.fallback == ""
    assert spec.env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") == "0=20480M"
    assert spec.env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == "25"
    assert spec.env("CUDA_MPS_PIPE_DIRECTORY") == "/run/nvidia/mps/pipe"
    assert spec.env("PYTHONPATH") is None  # no shim directory configured
    assert MountSpec("/run/nvidia/mps/pipe", "/run/nvidia/mps/pipe", read_only=False) in spec.mounts


def test_an_mps_share_without_the_pipe_directory_falls_back_to_cooperative() -> None:
    """When the pipe directory is gone, an MPS record is held cooperatively and the env says so."""
    spec = container_spec(share(0, 1024, 10), inventory(), MPS, Enforcement.HARD_MPS, mps_ready=False)
    assert spec.enforcement is COOPERATIVE and spec.env("LINKPACK_ENFORCEMENT") == "cooperative"
    assert spec.env("LINKPACK_ENFORCEMENT_FALLBACK") == spec.fallback and "mps" in spec.fallback
    assert spec.env("CUDA_MPS_PIPE_DIRECTORY") is None and spec.mounts == ()
    assert spec.env("LINKPACK_MEMORY_LIMIT_MIB") == "1024"


@pytest.mark.timeout(10)
def test_an_interposer_record_without_the_library_is_held_cooperatively_and_says_so() -> None:
    """A share recorded for the CUDA interposer on a node without the library is held cooperatively and says so."""
    spec = container_spec(
        share(0, 2048, 10), inventory(), FULL, Enforcement.INTERPOSER, interposer_ready=False
    )
    assert spec.enforcement is COOPERATIVE and spec.env("LINKPACK_ENFORCEMENT") == "cooperative"
    assert "interposer library is not installed" in (spec.env("LINKPACK_ENFORCEMENT_FALLBACK") or "")
    assert spec.env("LINKPACK_MEMORY_LIMIT_MIB") == "2048" and spec.env("PYTHONPATH") == SHIM_CONTAINER_PATH
    assert spec.env("LD_PRELOAD") is None and spec.env("LINKPACK_COMPUTE_UNITS") is None
    assert [m.container_path for m in spec.mounts] == [SHIM_CONTAINER_PATH]
    unconfigured = container_spec(
        share(0, 2048, 10), inventory(), SHIM, Enforcement.INTERPOSER, interposer_ready=True
    )
    assert unconfigured.enforcement is COOPERATIVE and unconfigured.env("LD_PRELOAD") is None


@pytest.mark.timeout(10)
def test_an_interposer_share_gets_the_preloaded_library_its_caps_and_the_state_directory() -> None:
    """An interposer share gets the library mounted and preloaded, its memory and compute caps, its priority and the shared state directory, beside the shim."""
    spec = container_spec(
        share(2, 20480, 30),
        inventory(),
        FULL,
        Enforcement.INTERPOSER,
        interposer_ready=True,
        priority=ComputePriority.HIGH,
    )
    assert spec.enforcement is Enforcement.INTERPOSER and spec.fallback == ""
    assert (
        spec.env("LINKPACK_ENFORCEMENT") == "interposer" and spec.env("LINKPACK_ENFORCEMENT_FALLBACK") is None
    )
    assert (
        spec.env("LD_PRELOAD") == INTERPOSER_CONTAINER_PATH == "/opt/linkpack/interposer/liblinkpack_cuda.so"
    )
    assert spec.env("LINKPACK_MEMORY_LIMIT_MIB") == "20480" and spec.env("LINKPACK_MEMORY_FRACTION") == "0.25"
    assert spec.env("LINKPACK_COMPUTE_UNITS") == "30" and spec.env("LINKPACK_UNITS_PER_GPU") == "100"
    assert spec.env("LINKPACK_COMPUTE_PRIORITY") == "high"
    assert spec.env("LINKPACK_GPU_STATE_DIR") == GPU_STATE_CONTAINER_PATH == "/run/linkpack/gpu-state"
    assert spec.env("PYTHONPATH") == SHIM_CONTAINER_PATH  # the framework shim too
    assert spec.mounts == (
        MountSpec(SHIM_CONTAINER_PATH, "/opt/linkpack-host/shim", read_only=True),
        MountSpec(INTERPOSER_CONTAINER_DIR, "/opt/linkpack-host/shim/interposer", read_only=True),
        MountSpec(GPU_STATE_CONTAINER_PATH, "/var/lib/linkpack/gpu-state", read_only=False),
    )
    assert not any(name.startswith("CUDA_MPS_") for name, _ in spec.envs)


@pytest.mark.timeout(10)
def test_an_interposer_share_without_a_state_directory_goes_without_priority_coordination() -> None:
    """Without a GPU state directory an interposer share still gets the library and its caps, but no state mount."""
    sharing = replace(FULL, gpu_state_dir=None)
    spec = container_spec(
        share(0, 1024, 100), inventory(), sharing, Enforcement.INTERPOSER, interposer_ready=True
    )
    assert (
        spec.env("LD_PRELOAD") == INTERPOSER_CONTAINER_PATH
        and spec.env("LINKPACK_COMPUTE_PRIORITY") == "normal"
    )
    assert spec.env("LINKPACK_COMPUTE_UNITS") == "100"  # a whole GPU's worth: the interposer sets no quota
    assert spec.env("LINKPACK_GPU_STATE_DIR") is None
    assert GPU_STATE_CONTAINER_PATH not in [m.container_path for m in spec.mounts]


@pytest.mark.timeout(10)
def test_an_mps_share_gets_per_client_limits_by_visible_ordinal_and_its_priority() -> None:
    """A hard-MPS share gets a pinned memory limit per visible device ordinal, its thread percentage and the MPS client priority."""
    grants = (*share(3, 4096, 30), *share(1, 2048, 50))
    spec = container_spec(
        grants, inventory(), FULL, Enforcement.HARD_MPS, mps_ready=True, priority=ComputePriority.LOW
    )
    assert spec.enforcement is Enforcement.HARD_MPS and spec.env("LINKPACK_ENFORCEMENT") == "hard-mps"
    assert spec.env("NVIDIA_VISIBLE_DEVICES") == f"{uuid(1)},{uuid(3)}"
    assert (
        spec.env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") == "0=2048M,1=4096M"
    )  # ordinals as the container sees them
    assert spec.env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == "30"
    assert spec.env("CUDA_MPS_CLIENT_PRIORITY") == "1"  # below normal
    assert spec.env("CUDA_MPS_PIPE_DIRECTORY") == "/run/nvidia/mps/pipe"
    assert MountSpec("/dev/shm", "/var/lib/linkpack/mps/shm", read_only=False) in spec.mounts
    assert spec.env("LD_PRELOAD") is None and spec.env("LINKPACK_COMPUTE_UNITS") is None
    high = container_spec(
        share(0, 1, 1), inventory(), FULL, Enforcement.HARD_MPS, mps_ready=True, priority=ComputePriority.HIGH
    )
    assert high.env("CUDA_MPS_CLIENT_PRIORITY") == "0"  # normal: MPS has nothing above it
    normal = container_spec(share(0, 1, 1), inventory(), FULL, Enforcement.HARD_MPS, mps_ready=True)
    assert normal.env("CUDA_MPS_CLIENT_PRIORITY") is None


@pytest.mark.timeout(10)
@pytest.mark.parametrize("level", [Enforcement.NONE, Enforcement.MIG])
def test_whole_gpus_and_mig_instances_pass_through_without_preload_or_mps_variables(
    level: Enforcement,
) -> None:
    """Whole-GPU and MIG containers get neither LD_PRELOAD, MPS variables, caps nor mounts, on a node that offers every level."""
    grants = whole(0, 1) if level is Enforcement.NONE else mig(1, 0)
    spec = container_spec(
        grants,
        inventory(2, mig_gpus=(1,)),
        FULL,
        level,
        mps_ready=True,
        interposer_ready=True,
        priority=ComputePriority.LOW,
    )
    assert spec.enforcement is level and spec.fallback == ""
    assert spec.mounts == ()
    assert {name for name, _ in spec.envs} == {
        "NVIDIA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "LINKPACK_ENFORCEMENT",
    }


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("recorded", "ready", "why"),
    [
        (Enforcement.INTERPOSER, {"mps_ready": True}, "interposer library is not installed"),
        (Enforcement.HARD_MPS, {"interposer_ready": True}, "MPS does not serve this node now"),
    ],
)
def test_a_level_the_node_cannot_give_now_falls_back_to_cooperative_only(recorded, ready, why) -> None:
    """A share whose level the node cannot give now is held cooperatively, never by another strong level, and says why."""
    spec = container_spec(share(0, 2048, 25), inventory(), FULL, recorded, **ready)
    assert spec.enforcement is COOPERATIVE and why in spec.fallback
    assert (
        spec.env("LINKPACK_ENFORCEMENT") == "cooperative"
        and spec.env("LINKPACK_ENFORCEMENT_FALLBACK") == spec.fallback
    )
    assert spec.env("LD_PRELOAD") is None and not any(n.startswith("CUDA_MPS_") for n, _ in spec.envs)
    assert spec.env("LINKPACK_MEMORY_LIMIT_MIB") == "2048" and spec.env("PYTHONPATH") == SHIM_CONTAINER_PATH


def test_a_units_only_share_caps_no_memory() -> None:
    """A share that reserves no memory caps none, and under MPS still limits the threads."""
    spec = container_spec(share(0, 0, 50), inventory(), SHIM, Enforcement.HARD_MPS, mps_ready=True)
    assert spec.env("LINKPACK_MEMORY_LIMIT_MIB") == "0" and spec.env("LINKPACK_MEMORY_FRACTION") == "0"
    assert spec.env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") is None
    assert spec.env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == "50"


def test_memory_fractions_round_down_and_never_exceed_one() -> None:
    """Memory fractions are rounded down to six decimals and capped at one."""
    assert memory_fraction(1, 3) == "0.333333"
    assert memory_fraction(GPU_MEMORY_MIB, GPU_MEMORY_MIB) == "1"
    assert memory_fraction(GPU_MEMORY_MIB * 2, GPU_MEMORY_MIB) == "1"
    assert memory_fraction(5, 0) == "0"


def test_envs_are_sorted_for_a_stable_response() -> None:
    """Environment variables come sorted, so the same grants always give the same response."""
    spec = container_spec(share(0, 100, 1), inventory(), SHIM, COOPERATIVE)
    names = [k for k, _ in spec.envs]
    assert names == sorted(names)
