"""What a container's environment and mounts say for each kind of grant."""

from __future__ import annotations

from contract.allocation import Enforcement, enforcement_for
from node_agent.deviceplugin.container_spec import (
    SHIM_CONTAINER_PATH,
    MountSpec,
    SharingConfig,
    applied_enforcement,
    container_spec,
    memory_fraction,
)

from .builders import GPU_MEMORY_MIB, inventory, mig, mig_uuid, share, uuid, whole

SHIM = SharingConfig(shim_host_dir="/opt/linkpack-host/shim")
MPS = SharingConfig(mps_pipe_dir="/run/nvidia/mps/pipe")
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


def test_an_interposer_record_is_held_cooperatively_on_this_node() -> None:
    """A share recorded for the CUDA interposer, which this node does not deliver, is held cooperatively and says so."""
    spec = container_spec(share(0, 2048, 10), inventory(), SHIM, Enforcement.INTERPOSER, mps_ready=True)
    assert spec.enforcement is COOPERATIVE and spec.env("LINKPACK_ENFORCEMENT") == "cooperative"
    assert "does not deliver the CUDA interposer" in (spec.env("LINKPACK_ENFORCEMENT_FALLBACK") or "")
    assert spec.env("LINKPACK_MEMORY_LIMIT_MIB") == "2048" and spec.env("PYTHONPATH") == SHIM_CONTAINER_PATH
    assert spec.env("LD_PRELOAD") is None


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
