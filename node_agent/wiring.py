"""Builds the node agent from its `AgentConfig`: the only module that imports every layer.

    sources (NVML, `topo -m`, simulation) ──> Agent (loop.agent_loop) ──> GpuTopology (loop.publisher)
                                                │   └─> memory watchdog, metrics
                                                └─> DevicePluginHost (deviceplugin.plugin_host)
    loop.agent_http serves /metrics, /healthz and /debug/* from the agent and the simulation.

`run` opens the sources, connects to the API (`kube.client`), runs the first poll, starts
the HTTP endpoints and the device plugins, and then the loop until SIGTERM/SIGINT.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from node_agent.config import AgentConfig, parse_args
from node_agent.deviceplugin.container_spec import SharingConfig
from node_agent.deviceplugin.plugin_host import DevicePluginHost, DevicePluginSettings, prepare_shim
from node_agent.deviceplugin.pod_records import KubePodRecords
from node_agent.deviceplugin.server import PluginConfig
from node_agent.kube.client import KubernetesNodeApi
from node_agent.kube.node_api import KubeError, NodeApi
from node_agent.loop.agent_http import serve_http
from node_agent.loop.agent_loop import Agent
from node_agent.metrics import AgentMetrics
from node_agent.sharing.interposer_delivery import (
    interposer_installed,
    prepare_gpu_state_dir,
    prepare_interposer,
)
from node_agent.sharing.mps import MpsSettings, MpsSupervisor
from node_agent.sources.discovery import DiscoveryError
from node_agent.sources.opening import open_sources
from node_agent.sources.simulated_mig import MigLayoutError
from topology.catalog import CatalogError

log = logging.getLogger(__name__)


def device_plugin_settings(
    config: AgentConfig,
    shim_dir: str | None,
    interposer_dir: str | None = None,
    gpu_state_dir: str | None = None,
    mps_ready: Callable[[], bool] | None = None,
) -> DevicePluginSettings:
    return DevicePluginSettings(
        plugin=PluginConfig(
            plugin_dir=config.device_plugin_dir, pod_resources_socket=config.pod_resources_socket
        ),
        sharing=SharingConfig(
            shim_host_dir=shim_dir,
            mps_pipe_dir=config.mps_pipe_dir,
            interposer_host_dir=interposer_dir,
            gpu_state_dir=gpu_state_dir,
            mps_shm_dir=config.mps_shm_dir,
        ),
        units_per_gpu=config.units_per_gpu,
        resources=config.resources,
        mps_ready=mps_ready,
    )


def start_mps(config: AgentConfig) -> MpsSupervisor | None:
    """With `--mps`, start the MPS control daemon and return its supervisor (also when the first
    start failed: the agent's polls retry it with back-off); None without `--mps`."""
    if not config.mps_supervise or config.mps_pipe_dir is None:
        return None
    supervisor = MpsSupervisor(
        MpsSettings(control=config.mps_control, pipe_dir=config.mps_pipe_dir, log_dir=config.mps_log_dir)
    )
    supervisor.start()
    return supervisor


def start_device_plugins(config: AgentConfig, agent: Agent, api: NodeApi | None) -> Callable[[], None] | None:
    """Start the kubelet device plugins (node_agent.deviceplugin) of this node.

    Called once after the first discovery and publish. They serve the devices of
    `agent.topology`, hand out what the pods' allocation records say (read and written back
    through `KubePodRecords`), advertise unhealthy or cordoned GPUs as Unhealthy after every
    poll, and export their counters on the agent's metrics. The framework shim and the CUDA
    interposer are installed in the shim's host directory first; once the plugins serve, the
    node publishes `interposer.available` for as long as the installed library is there. Returns
    the function that stops
    them, or None when they are off: `--no-device-plugin`, or no cluster (`--no-kube`; without
    the API there are no allocation records, so every request would be refused), or they could
    not start (logged; the agent keeps publishing and watching health).
    """
    if not config.device_plugin:
        log.info("device plugins off (--no-device-plugin)")
        agent.node_holds = lambda: None
        return None
    if api is None:
        log.info("device plugins off: no cluster to read allocation records from")
        agent.node_holds = lambda: None
        return None
    if not Path(config.device_plugin_dir).is_dir():  # checked first: no shim is installed then
        log.error("device plugins off: %s is not a directory (is a kubelet here?)", config.device_plugin_dir)
        agent.node_holds = lambda: None
        return None
    shim_dir = prepare_shim(config.shim_host_dir)
    interposer_dir = prepare_interposer(config.interposer_lib, shim_dir)
    state_dir = prepare_gpu_state_dir(config.gpu_state_dir) if interposer_dir is not None else None
    host = DevicePluginHost(
        device_plugin_settings(
            config, shim_dir, interposer_dir, state_dir, mps_ready=lambda: agent.mps.active
        ),
        KubePodRecords(api, config.node_name),
    )
    if not host.start(agent.topology, agent.health()):
        agent.node_holds = lambda: None
        return None
    if config.pod_resources_socket:
        inherited = agent.node_holds()
        agent.node_holds = lambda: host.holds() or inherited
    else:
        agent.node_holds = lambda: None  # nothing to tell what the kubelet holds
    if interposer_dir is not None:
        agent.interposer_ready = lambda: interposer_installed(interposer_dir)
    agent.metrics.watch_device_plugins(host.stats)
    agent.add_health_listener(host.update)

    def stop() -> None:
        host.drain(agent.publish_now)
        host.stop()

    return stop


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line and run the agent; the process exit status."""
    return run(parse_args(argv))


def run(config: AgentConfig) -> int:
    """Run the agent until SIGTERM/SIGINT; 2 when it cannot start."""
    logging.basicConfig(level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    api: NodeApi | None = None
    try:
        sources = open_sources(
            config.simulate,
            config.node_name,
            use_smi=config.use_smi,
            nvidia_smi=config.nvidia_smi,
            simulate_driver=config.simulate_driver,
            simulate_cuda=config.simulate_cuda,
            simulate_mig=config.simulate_mig,
        )
        if config.use_kube:
            api = KubernetesNodeApi.from_config(config.node_name, config.kubeconfig, config.resources)
        agent = Agent(config, sources.reader, api, AgentMetrics(), sources.topo_text)
    except (CatalogError, DiscoveryError, KubeError, MigLayoutError, OSError) as exc:
        log.error("cannot start: %s", exc)
        return 2
    if config.print_discovery:
        print(json.dumps(agent.state(), indent=2, sort_keys=True))
        return 0
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server = (
        serve_http(agent, sources.simulated, config.metrics_host, config.metrics_port)
        if config.metrics_port
        else None
    )
    mps = start_mps(config)
    if mps is not None:
        agent.mps = mps
    agent.poll()
    stop_plugins = start_device_plugins(config, agent, api)
    log.info("agent running on node %s with %d GPUs", config.node_name, agent.topology.gpu_count)
    try:
        agent.run(stop)
    finally:
        log.info("agent stopping")
        if stop_plugins is not None:
            stop_plugins()
        if mps is not None:
            mps.stop()
        if server is not None:
            server.shutdown()
            server.server_close()
        if sources.reader is not None:
            sources.reader.close()
    return 0
