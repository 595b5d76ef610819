"""The agent's command line and environment, as one AgentConfig."""

from __future__ import annotations

import pytest

from contract.resources import ResourceNames
from node_agent.config import DEFAULT_SHIM_HOST_DIR, parse_args


def test_config_parsing():
    """Flags and $NODE_NAME become the config; bad values exit with a usage error."""
    config = parse_args(["--simulate", "hgx-h100", "--xid-severity", "31=needs-reset", "--no-kube"], env={})
    assert config.node_name == "sim-hgx-h100" and not config.use_kube and config.simulated
    assert dict(config.xid_overrides) == {31: "needs-reset"}
    assert parse_args([], env={"NODE_NAME": "gpu-7"}).node_name == "gpu-7"
    with pytest.raises(SystemExit):
        parse_args(["--xid-severity", "31=bad"], env={})
    with pytest.raises(SystemExit):
        parse_args(["--poll-interval", "0"], env={})


def test_device_plugin_flags():
    """The device-plugin flags have the kubelet's default paths and can all be changed or turned off."""
    default = parse_args([], env={})
    assert default.device_plugin and default.units_per_gpu == 100 and default.mps_pipe_dir is None
    assert default.shim_host_dir == DEFAULT_SHIM_HOST_DIR == "/var/lib/linkpack/shim"
    assert default.device_plugin_dir == "/var/lib/kubelet/device-plugins"
    assert default.pod_resources_socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert not parse_args(["--no-device-plugin"], env={}).device_plugin
    assert not parse_args(["--no-kube"], env={}).device_plugin  # no records to serve without the API
    custom = parse_args(
        [
            "--device-plugin-dir=/dp",
            "--pod-resources-socket=",
            "--units-per-gpu=8",
            "--shim-host-dir=",
            "--mps-pipe-dir=/run/mps",
        ],
        env={},
    )
    assert (custom.device_plugin_dir, custom.pod_resources_socket, custom.units_per_gpu) == ("/dp", None, 8)
    assert custom.shim_host_dir is None and custom.mps_pipe_dir == "/run/mps"
    for bad in ("0", "1.5"):
        with pytest.raises(SystemExit):
            parse_args(["--units-per-gpu", bad], env={})


def test_resource_names_and_units_come_from_the_same_environment_as_the_extenders():
    """`LINKPACK_RESOURCE_*` and `LINKPACK_UNITS_PER_GPU` set the names and the default units; a flag still wins."""
    env = {"LINKPACK_RESOURCE_GPU": "example.com/gpu", "LINKPACK_UNITS_PER_GPU": "8"}
    config = parse_args([], env=env)
    assert config.resources == ResourceNames(whole="example.com/gpu") and config.units_per_gpu == 8
    assert parse_args(["--units-per-gpu=4"], env=env).units_per_gpu == 4
    assert parse_args([], env={}).resources == ResourceNames()


def test_a_bad_resource_setting_is_a_usage_error(capsys):
    """A resource name that is not domain-qualified stops the agent with the variable named."""
    with pytest.raises(SystemExit):
        parse_args([], env={"LINKPACK_RESOURCE_GPU": "gpu"})
    assert "LINKPACK_RESOURCE_GPU" in capsys.readouterr().err


@pytest.mark.timeout(10)
def test_interposer_and_mps_supervision_flags():
    """The interposer, GPU state and MPS supervision flags have their defaults and can be changed or turned off."""
    default = parse_args([], env={})
    assert default.interposer_lib == "/opt/linkpack/lib/liblinkpack_cuda.so"
    assert default.gpu_state_dir == "/var/lib/linkpack/gpu-state"
    assert not default.mps_supervise and default.mps_pipe_dir is None and default.mps_shm_dir is None
    assert (
        default.mps_control == "nvidia-cuda-mps-control"
        and default.mps_log_dir == "/var/lib/linkpack/mps/log"
    )
    off = parse_args(["--interposer-lib=", "--gpu-state-dir="], env={})
    assert off.interposer_lib is None and off.gpu_state_dir is None
    supervised = parse_args(
        ["--mps", "--mps-control=/usr/bin/mpsc", "--mps-shm-dir=/var/lib/linkpack/mps/shm"], env={}
    )
    assert supervised.mps_supervise and supervised.mps_pipe_dir == "/var/lib/linkpack/mps/pipe"
    assert (supervised.mps_control, supervised.mps_shm_dir) == ("/usr/bin/mpsc", "/var/lib/linkpack/mps/shm")
    external = parse_args(["--mps-pipe-dir=/run/mps"], env={})
    assert not external.mps_supervise and external.mps_pipe_dir == "/run/mps"
