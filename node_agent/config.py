"""Command line and environment of the node agent, as one frozen `AgentConfig`.

Imports nothing heavy (no gRPC, no Kubernetes client), so `--help` works anywhere. The extended
resource names and the share units per GPU come from the same `LINKPACK_RESOURCE_*` /
`LINKPACK_UNITS_PER_GPU` variables the extender reads (`contract.resources`), read once here.
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from contract.resources import (
    DEFAULT_UNITS_PER_GPU,
    ResourceConfigError,
    ResourceNames,
    units_per_gpu_from_env,
)
from node_agent.deviceplugin.paths import DEFAULT_PLUGIN_DIR, DEFAULT_POD_RESOURCES_SOCKET
from node_agent.health import Severity
from node_agent.sharing.interposer_delivery import DEFAULT_INTERPOSER_LIB
from node_agent.sharing.mps import DEFAULT_MPS_CONTROL, DEFAULT_MPS_LOG_DIR, DEFAULT_MPS_PIPE_DIR
from node_agent.sources.nvml_reader import parse_cuda_version
from node_agent.sources.nvml_simulated import SimulatedNvml
from node_agent.sources.simulated_mig import MigLayoutError
from topology.catalog import CatalogError

DEFAULT_METRICS_PORT = 9402
DEFAULT_SHIM_HOST_DIR = "/var/lib/linkpack/shim"
DEFAULT_GPU_STATE_DIR = "/var/lib/linkpack/gpu-state"


@dataclass(frozen=True)
class AgentConfig:
    node_name: str
    simulate: str | None = None  # catalog machine name or `topo -m` file
    kubeconfig: str | None = None
    use_kube: bool = True
    metrics_host: str = "0.0.0.0"  # a DaemonSet serves metrics on the pod IP
    metrics_port: int = DEFAULT_METRICS_PORT
    poll_interval_s: float = 5.0
    heartbeat_interval_s: float = 30.0
    rediscover_interval_s: float = 600.0
    recheck_after_s: float = 300.0
    fatal_recheck_after_s: float | None = None
    use_smi: bool = True
    nvidia_smi: str = "nvidia-smi"
    model_hint: str = ""
    memory_hint_mib: int = 0
    watchdog: bool = True
    watchdog_kill: bool = False
    watchdog_tolerance_mib: int = 0
    proc_root: Path = Path("/proc")
    xid_overrides: Mapping[int, Severity] = field(default_factory=dict)
    print_discovery: bool = False
    log_level: str = "INFO"
    # the kubelet device plugins (needs the API: the allocation records live on the pods)
    device_plugin: bool = True
    device_plugin_dir: str = DEFAULT_PLUGIN_DIR
    pod_resources_socket: str | None = DEFAULT_POD_RESOURCES_SOCKET  # None: no check against it
    units_per_gpu: int = DEFAULT_UNITS_PER_GPU
    shim_host_dir: str | None = DEFAULT_SHIM_HOST_DIR  # None: shares get no framework shim
    mps_pipe_dir: str | None = None  # the MPS control daemon's pipe directory (`node_agent.sharing.mps`)
    mps_supervise: bool = False  # run and watch the MPS control daemon (`--mps`)
    mps_control: str = DEFAULT_MPS_CONTROL  # the control binary the supervisor runs
    mps_log_dir: str = DEFAULT_MPS_LOG_DIR  # CUDA_MPS_LOG_DIRECTORY of the supervised daemon
    mps_shm_dir: str | None = None  # host dir that is the daemon's /dev/shm, mounted so in clients
    interposer_lib: str | None = DEFAULT_INTERPOSER_LIB  # the CUDA interposer to install; None: none
    gpu_state_dir: str | None = DEFAULT_GPU_STATE_DIR  # shared by share containers (interposer priority)
    resources: ResourceNames = field(default_factory=ResourceNames)  # names pods ask for GPUs by
    node_labels: bool = True  # keep the node's GPU labels (`node_agent.loop.node_labels`)
    set_power_limits: bool = False  # hold GPUs at their pods' power budgets (`node_agent.loop.power`)
    simulate_driver: str | None = None  # the simulated driver's version (simulate mode only)
    simulate_cuda: str | None = None  # the CUDA version the simulated driver runs, MAJOR.MINOR
    #: simulated GPUs started in MIG mode: GPU index -> its instances' profiles (`--simulate-mig`)
    simulate_mig: Mapping[int, tuple[str, ...]] = field(default_factory=dict)

    @property
    def simulated(self) -> bool:
        return self.simulate is not None


def agent_version() -> str:
    try:
        return metadata.version("linkpack")
    except metadata.PackageNotFoundError:
        return "0.0.0+unknown"


def parse_args(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> AgentConfig:
    """The agent's settings from its command line and environment; exits with a usage error
    naming the bad argument or variable."""
    env = os.environ if env is None else env
    try:
        resources = ResourceNames.from_env(env)
        units_default = units_per_gpu_from_env(env)
    except ResourceConfigError as exc:
        resources, units_default, bad_env = ResourceNames(), DEFAULT_UNITS_PER_GPU, str(exc)
    else:
        bad_env = ""
    p = argparse.ArgumentParser(
        prog="python -m node_agent",
        description="Linkpack node agent: GPU discovery, topology publishing, health, metrics.",
    )
    _add_agent_arguments(p, env)
    _add_device_plugin_arguments(p, units_default)
    _add_mps_arguments(p)
    _add_node_and_simulation_arguments(p)
    a = p.parse_args(argv)
    if bad_env:
        p.error(bad_env)
    return _config(p, a, resources)


def _add_agent_arguments(p: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    """Discovery, publishing, health and the memory watchdog."""
    p.add_argument(
        "--simulate",
        metavar="FILE_OR_PROFILE",
        help="use a simulated NVML built from a catalog machine (dgx-a100, hgx-h100, dgx1-v100, ...) "
        "or a `nvidia-smi topo -m` file; enables POST /debug/inject on the metrics port",
    )
    p.add_argument(
        "--node-name", default=env.get("NODE_NAME"), help="this node's name (default: $NODE_NAME, hostname)"
    )
    p.add_argument(
        "--kubeconfig", default=env.get("KUBECONFIG"), help="kubeconfig file (default: in-cluster)"
    )
    p.add_argument("--no-kube", action="store_true", help="run without a cluster: no publishing, no pods")
    p.add_argument("--metrics-host", default="0.0.0.0")
    p.add_argument(
        "--metrics-port", type=int, default=DEFAULT_METRICS_PORT, help="0 disables the HTTP server"
    )
    p.add_argument("--poll-interval", type=_positive, default=5.0, metavar="SECONDS")
    p.add_argument("--heartbeat-interval", type=_positive, default=30.0, metavar="SECONDS")
    p.add_argument("--rediscover-interval", type=_positive, default=600.0, metavar="SECONDS")
    p.add_argument("--recheck-after", type=_positive, default=300.0, metavar="SECONDS",
                   help="re-check an unhealthy GPU this long after its last fault")  # fmt: skip
    p.add_argument("--fatal-recheck-after", type=_positive, default=None, metavar="SECONDS",
                   help="also re-check GPUs with fatal faults (default: never)")  # fmt: skip
    p.add_argument("--no-smi", action="store_true", help="do not run `nvidia-smi topo -m`")
    p.add_argument("--nvidia-smi", default="nvidia-smi", help="path of nvidia-smi")
    p.add_argument("--model-hint", default="", help="GPU model when only `topo -m` is available")
    p.add_argument(
        "--memory-hint-mib", type=int, default=0, help="GPU memory when only `topo -m` is available"
    )
    p.add_argument("--no-watchdog", action="store_true", help="do not police per-pod GPU memory")
    p.add_argument(
        "--watchdog-kill", action="store_true", help="kill processes of pods above their memory share"
    )
    p.add_argument("--watchdog-tolerance-mib", type=int, default=0)
    p.add_argument("--proc-root", default="/proc", help="where host processes are visible (hostPID)")
    p.add_argument("--xid-severity", action="append", default=[], metavar="XID=SEVERITY",
                   help="override one XID's class: application, notice, needs-reset or fatal")  # fmt: skip
    p.add_argument(
        "--print-discovery", action="store_true", help="print the discovered topology as JSON and exit"
    )
    p.add_argument("--log-level", default=env.get("LINKPACK_LOG_LEVEL", "INFO"))


def _add_device_plugin_arguments(p: argparse.ArgumentParser, units_default: int) -> None:
    dp = p.add_argument_group("device plugin")
    dp.add_argument("--no-device-plugin", action="store_true",
                    help="do not serve the kubelet device plugins (implied by --no-kube: without "
                    "the API there are no allocation records to hand out)")  # fmt: skip
    dp.add_argument("--device-plugin-dir", default=DEFAULT_PLUGIN_DIR,
                    help="the kubelet's device-plugin directory (kubelet.sock and our sockets)")  # fmt: skip
    dp.add_argument("--pod-resources-socket", default=DEFAULT_POD_RESOURCES_SOCKET,
                    help="the kubelet's pod-resources socket, to check handouts against; '' skips")  # fmt: skip
    dp.add_argument("--units-per-gpu", type=_positive_int, default=units_default,
                    help="share units each GPU is divided into (must match the extender's; "
                    "default: $LINKPACK_UNITS_PER_GPU, else 100)")  # fmt: skip
    dp.add_argument("--shim-host-dir", default=DEFAULT_SHIM_HOST_DIR,
                    help="host directory the framework shim is copied to and mounted from into "
                    "containers given a share (the same path inside the agent's container); '' skips")  # fmt: skip
    dp.add_argument("--mps-pipe-dir", default=None,
                    help="pipe directory of the node's CUDA MPS control daemon; while it exists the "
                    "node publishes mps.active and shares recorded as MPS get the MPS client limits "
                    f"(with --mps: the supervised daemon's, default {DEFAULT_MPS_PIPE_DIR})")  # fmt: skip
    dp.add_argument("--interposer-lib", default=DEFAULT_INTERPOSER_LIB, metavar="PATH",
                    help="the CUDA interposer (liblinkpack_cuda.so) to install in the shim's host "
                    "directory and LD_PRELOAD into shares recorded for it; '' leaves it out")  # fmt: skip
    dp.add_argument("--gpu-state-dir", default=DEFAULT_GPU_STATE_DIR,
                    help="host directory shared read-write by the node's share containers, for the "
                    "interposer's priority between sharers; '' leaves priority out")  # fmt: skip


def _add_mps_arguments(p: argparse.ArgumentParser) -> None:
    mps = p.add_argument_group("CUDA MPS supervision")
    mps.add_argument("--mps", action="store_true",
                     help="run the CUDA MPS control daemon (`nvidia-cuda-mps-control -d`), restart it "
                     "when it dies and stop it at exit; the GPUs' compute mode is left as it is")  # fmt: skip
    mps.add_argument("--mps-control", default=DEFAULT_MPS_CONTROL,
                     help="path of nvidia-cuda-mps-control (default: found on PATH)")  # fmt: skip
    mps.add_argument("--mps-log-dir", default=DEFAULT_MPS_LOG_DIR,
                     help="CUDA_MPS_LOG_DIRECTORY of the supervised daemon")  # fmt: skip
    mps.add_argument("--mps-shm-dir", default=None,
                     help="host directory the agent's container has as /dev/shm (where the daemon "
                     "keeps its shared memory), mounted at /dev/shm in MPS share containers")  # fmt: skip


def _add_node_and_simulation_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-node-labels", action="store_true",
                   help="do not label the node (nvidia.com/gpu.product, topology.kubernetes.io/nvidia-sxm, "
                   "linkpack.io/nvlink-clique, ...; see docs/operator-guide.md)")  # fmt: skip
    p.add_argument("--set-power-limits", action="store_true",
                   help="hold each GPU granted to a pod with a power budget at that budget and put the "
                   "default limit back after; needs root, and resets limits set by hand")  # fmt: skip
    p.add_argument("--simulate-driver", default=None, metavar="VERSION",
                   help="with --simulate: the simulated driver's version (default 550.54.15)")  # fmt: skip
    p.add_argument("--simulate-cuda", default=None, metavar="MAJOR.MINOR",
                   help="with --simulate: the CUDA version the simulated driver runs (default 12.4)")  # fmt: skip
    p.add_argument("--simulate-mig", default=None, metavar="GPU=PROFILE[*N][+...][,...]",
                   help="with --simulate: start these GPUs in MIG mode with these instances of the "
                   "model's real profiles, e.g. 7=1g.5gb*7 or 6=3g.20gb+2g.10gb+1g.5gb*2,7=7g.40gb "
                   "on a DGX A100 (A100 40GB); the other GPUs stay whole")  # fmt: skip


def _config(p: argparse.ArgumentParser, a: argparse.Namespace, resources: ResourceNames) -> AgentConfig:
    """The parsed arguments checked against each other, as an `AgentConfig`."""
    if (a.simulate_driver, a.simulate_cuda, a.simulate_mig) != (None, None, None) and a.simulate is None:
        p.error("--simulate-driver, --simulate-cuda and --simulate-mig need --simulate")
    if a.simulate_cuda is not None and parse_cuda_version(a.simulate_cuda) is None:
        p.error(f"--simulate-cuda {a.simulate_cuda!r}: expected MAJOR.MINOR, e.g. 12.4")
    node = a.node_name or (_simulated_node_name(a.simulate) if a.simulate else socket.gethostname())
    use_kube = not a.no_kube and not a.print_discovery
    simulate_mig = _simulate_mig(p, a.simulate, a.simulate_mig, node) if a.simulate_mig is not None else {}
    return AgentConfig(
        node_name=node,
        simulate=a.simulate,
        kubeconfig=a.kubeconfig,
        use_kube=use_kube,
        metrics_host=a.metrics_host,
        metrics_port=a.metrics_port,
        poll_interval_s=a.poll_interval,
        heartbeat_interval_s=a.heartbeat_interval,
        rediscover_interval_s=a.rediscover_interval,
        recheck_after_s=a.recheck_after,
        fatal_recheck_after_s=a.fatal_recheck_after,
        use_smi=not a.no_smi,
        nvidia_smi=a.nvidia_smi,
        model_hint=a.model_hint,
        memory_hint_mib=a.memory_hint_mib,
        watchdog=not a.no_watchdog,
        watchdog_kill=a.watchdog_kill,
        watchdog_tolerance_mib=a.watchdog_tolerance_mib,
        proc_root=Path(a.proc_root),
        xid_overrides=_xid_overrides(p, a.xid_severity),
        print_discovery=a.print_discovery,
        log_level=a.log_level.upper(),
        device_plugin=use_kube and not a.no_device_plugin,
        device_plugin_dir=a.device_plugin_dir,
        pod_resources_socket=a.pod_resources_socket or None,
        units_per_gpu=a.units_per_gpu,
        shim_host_dir=a.shim_host_dir or None,
        mps_pipe_dir=a.mps_pipe_dir or (DEFAULT_MPS_PIPE_DIR if a.mps else None),
        mps_supervise=a.mps,
        mps_control=a.mps_control,
        mps_log_dir=a.mps_log_dir,
        mps_shm_dir=a.mps_shm_dir or None,
        interposer_lib=a.interposer_lib or None,
        gpu_state_dir=a.gpu_state_dir or None,
        resources=resources,
        node_labels=not a.no_node_labels,
        set_power_limits=a.set_power_limits,
        simulate_driver=a.simulate_driver,
        simulate_cuda=a.simulate_cuda,
        simulate_mig=simulate_mig,
    )


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _xid_overrides(p: argparse.ArgumentParser, items: Sequence[str]) -> dict[int, Severity]:
    overrides: dict[int, Severity] = {}
    for item in items:
        xid, sep, severity = item.partition("=")
        try:
            overrides[int(xid)] = Severity(severity.strip().lower())
        except ValueError:
            choices = ", ".join(s.value for s in Severity)
            p.error(f"--xid-severity {item!r}: expected XID=SEVERITY with SEVERITY one of {choices}")
        if not sep:
            p.error(f"--xid-severity {item!r}: expected XID=SEVERITY")
    return overrides


def parse_mig_layout(text: str) -> dict[int, tuple[str, ...]]:
    """`--simulate-mig` text as {GPU index: profiles}: comma-separated `GPU=SPEC`, SPEC being
    `+`-separated `PROFILE` or `PROFILE*N` (N instances), e.g. "6=3g.20gb+1g.5gb*4,7=7g.40gb".
    ValueError names the part that is malformed; whether the GPUs can host it is not checked."""
    layout: dict[int, tuple[str, ...]] = {}
    for item in text.split(","):
        gpu, sep, spec = (part.strip() for part in item.partition("="))
        if not sep or not gpu or not spec:
            raise ValueError(f"{item.strip()!r} is not GPU=PROFILE[*N][+PROFILE[*N]...]")
        if not gpu.isdigit():
            raise ValueError(f"{gpu!r} is not a GPU index")
        index = int(gpu)
        if index in layout:
            raise ValueError(f"GPU {index} is given twice")
        profiles: list[str] = []
        for term in spec.split("+"):
            profile, star, count = (part.strip() for part in term.partition("*"))
            if not profile:
                raise ValueError(f"GPU {index}: an empty profile in {spec!r}")
            if star and not (count.isdigit() and int(count) > 0):
                raise ValueError(f"GPU {index}: {term.strip()!r} needs a positive count after '*'")
            profiles += [profile.lower()] * (int(count) if star else 1)
        layout[index] = tuple(profiles)
    return layout


def _simulate_mig(
    p: argparse.ArgumentParser, simulate: str, text: str, node: str
) -> dict[int, tuple[str, ...]]:
    """The parsed `--simulate-mig`, checked against the simulated machine's GPUs (their index,
    model and memory) by building the simulation it will run with."""
    try:
        layout = parse_mig_layout(text)
    except ValueError as exc:
        p.error(f"--simulate-mig {text!r}: {exc}")
    try:
        SimulatedNvml.from_machine(simulate, node_name=node, mig_layout=layout)
    except MigLayoutError as exc:
        p.error(f"--simulate-mig {text!r}: {exc}")
    except (CatalogError, OSError) as exc:
        p.error(f"--simulate {simulate!r}: {exc}")
    return layout


def _simulated_node_name(profile: str) -> str:
    stem = Path(profile).stem.lower()
    cleaned = "".join(c if c.isalnum() else "-" for c in stem).strip("-")
    return f"sim-{cleaned or 'node'}"[:63]
