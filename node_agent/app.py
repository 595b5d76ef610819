"""The node agent loop: discover, publish, watch health, police memory, serve metrics.

`Agent` owns the decisions of one node and is driven by `run` (or by `poll` /
`handle_event` directly in tests). `main` wires the real or simulated sources to it, starts
the HTTP endpoints of `agent_http` on the metrics port and, after the first poll, the kubelet
device plugins (`start_device_plugins`), which follow the agent's health and topology.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node_agent.agent_http import serve_http
from node_agent.config import AgentConfig, agent_version, parse_args
from node_agent.deviceplugin.container_spec import SharingConfig
from node_agent.deviceplugin.server import PluginConfig
from node_agent.discovery import Discovery, DiscoveryError, discover
from node_agent.health import (
    CORDON_ANNOTATION,
    CordonError,
    GpuHealth,
    HealthChange,
    HealthPolicy,
    HealthTracker,
    ecc_fault,
    parse_cordon_annotation,
    unknown_cordoned,
    unreadable_fault,
)
from node_agent.kube import AgentEvent, ClusterApi, KubeError, KubernetesClusterApi
from node_agent.metrics import AgentMetrics, GpuSample
from node_agent.nvml_pynvml import PynvmlReader
from node_agent.nvml_reader import NvmlError, NvmlReader, NvmlUnavailable, XidEvent
from node_agent.nvml_simulated import SimulatedNvml
from node_agent.plugin_host import DevicePluginHost, DevicePluginSettings, install_shim
from node_agent.pod_ledger import KubePodLedger
from node_agent.publisher import Publisher, health_entries
from node_agent.smi_runner import SmiError, run_topo_matrix
from node_agent.watchdog import Watchdog
from topology.catalog import MACHINES, CatalogError, topo_dir
from topology.codec import encode_topology
from topology.model import NodeTopology

log = logging.getLogger("node_agent")

#: Told the topology and GPU health after every poll and every health change.
HealthListener = Callable[[NodeTopology, tuple[GpuHealth, ...]], None]


@dataclass(frozen=True)
class DevicePluginContext:
    """What the device plugins get from the agent when they are started."""

    config: AgentConfig
    agent: Agent
    reader: NvmlReader | None
    cluster: ClusterApi | None
    stop: threading.Event


def start_device_plugins(context: DevicePluginContext) -> Callable[[], None] | None:
    """Start the kubelet device plugins (node_agent.deviceplugin) of this node.

    Called once after the first discovery and publish. They serve the devices of
    `context.agent.topology`, hand out what the pods' allocation records say (read and written
    back through `KubePodLedger`), advertise unhealthy or cordoned GPUs as Unhealthy after every
    poll, and export their counters on the agent's metrics. Returns the function that stops
    them, or None when they are off: `--no-device-plugin`, or no cluster (`--no-kube`; without
    the API there are no allocation records, so every request would be refused), or they could
    not start (logged; the agent keeps publishing and watching health).
    """
    config, agent = context.config, context.agent
    if not config.device_plugin:
        log.info("device plugins off (--no-device-plugin)")
        return None
    if context.cluster is None:
        log.info("device plugins off: no cluster to read allocation records from")
        return None
    if not Path(config.device_plugin_dir).is_dir():  # checked first: no shim is installed then
        log.error("device plugins off: %s is not a directory (is a kubelet here?)", config.device_plugin_dir)
        return None
    host = DevicePluginHost(
        device_plugin_settings(config, prepare_shim(config.shim_host_dir)),
        KubePodLedger(context.cluster, config.node_name),
    )
    if not host.start(agent.topology, agent.health()):
        return None
    agent.metrics.watch_device_plugins(host.stats)
    agent.add_health_listener(host.update)
    return host.stop


def device_plugin_settings(config: AgentConfig, shim_dir: str | None) -> DevicePluginSettings:
    return DevicePluginSettings(
        plugin=PluginConfig(
            plugin_dir=config.device_plugin_dir, pod_resources_socket=config.pod_resources_socket
        ),
        sharing=SharingConfig(shim_host_dir=shim_dir, mps_pipe_dir=config.mps_pipe_dir),
        units_per_gpu=config.units_per_gpu,
    )


def prepare_shim(directory: str | None) -> str | None:
    """Copy the framework shim to `directory` for the kubelet to mount; None (and containers
    get no shim) when there is no directory or it cannot be written."""
    if directory is None:
        return None
    try:
        install_shim(directory)
    except OSError as exc:
        log.error("cannot install the framework shim in %s, shares go without it: %s", directory, exc)
        return None
    return directory


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        reader: NvmlReader | None,
        cluster: ClusterApi | None,
        metrics: AgentMetrics,
        topo_text: Callable[[], str | None] = lambda: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.reader = reader
        self.cluster = cluster
        self.metrics = metrics
        self._topo_text = topo_text
        self._clock = clock
        self.discovery = self._discover()
        gpus = [(g.index, g.uuid) for g in self.topology.gpus]
        policy = HealthPolicy(
            recheck_after_s=config.recheck_after_s,
            fatal_recheck_after_s=config.fatal_recheck_after_s,
            xid_overrides=dict(config.xid_overrides),
        )
        self.tracker = HealthTracker(gpus, policy, clock)
        self.publisher = (
            Publisher(cluster, config.node_name, agent_version(), config.heartbeat_interval_s, clock)
            if cluster is not None
            else None
        )
        self.watchdog = (
            Watchdog(
                reader,
                config.node_name,
                proc_root=config.proc_root,
                tolerance_mib=config.watchdog_tolerance_mib,
                kill=config.watchdog_kill,
            )
            if reader is not None and config.watchdog
            else None
        )
        self._discovered_at = clock()
        self._cordon_error = ""
        self._health_listeners: list[HealthListener] = []
        self.last_loop_at = clock()
        if self.publisher is not None:
            self.publisher.load_existing()

    @property
    def topology(self) -> NodeTopology:
        return self.discovery.topology

    def health(self) -> tuple[GpuHealth, ...]:
        return self.tracker.snapshot()

    def add_health_listener(self, listener: HealthListener) -> None:
        """Call `listener(topology, health)` after every poll and every health change."""
        self._health_listeners.append(listener)

    def stalled(self) -> bool:
        """The loop has not polled for a while (for /healthz)."""
        return self._clock() - self.last_loop_at > 3 * self.config.poll_interval_s + 30

    # ------------------------------------------------------------------ the loop

    def run(self, stop: threading.Event) -> None:
        next_poll = 0.0
        while not stop.is_set():
            now = self._clock()
            if now >= next_poll:
                self.poll()
                next_poll = now + self.config.poll_interval_s
            wait_ms = int(max(0.0, min(next_poll - self._clock(), 1.0)) * 1000)
            if self.reader is None:
                stop.wait(wait_ms / 1000)
                continue
            try:
                event = self.reader.wait_event(wait_ms)
            except NvmlError as exc:
                log.warning("waiting for GPU events failed: %s", exc)
                stop.wait(1.0)
                continue
            if event is not None:
                self.handle_event(event)

    def handle_event(self, event: XidEvent) -> None:
        if event.gpu_index not in {h.index for h in self.tracker.snapshot()}:
            log.warning("event for GPU %d, which this agent does not track: %s", event.gpu_index, event)
            return
        fault, change = self.tracker.record_event(event)
        gpu = self.tracker.get(event.gpu_index)
        self.metrics.count_xid(gpu.index, gpu.uuid, event.xid, fault.severity)
        log.info("GPU %d event %s: %s [%s]", event.gpu_index, event.kind.value, fault.reason, fault.severity)
        if change is not None:
            self._announce((change,))
            self._publish()

    def poll(self) -> None:
        """One round of polling: samples, ECC, re-checks, cordons, rediscovery, watchdog, publish."""
        self.last_loop_at = self._clock()
        changes: list[HealthChange] = []
        changes.extend(self._sample_gpus())
        for index in self.tracker.due_for_recheck():
            passed, detail = self._probe(index)
            change = self.tracker.record_recheck(index, passed, detail)
            if change is not None:
                changes.append(change)
        changes.extend(self._refresh_cordons())
        if self._clock() - self._discovered_at >= self.config.rediscover_interval_s:
            self._rediscover()
        self._announce(changes)
        self._police_memory()
        self._publish()

    # ------------------------------------------------------------------ steps

    def _discover(self) -> Discovery:
        text = self._topo_text()
        found = discover(self.reader, text, self.config.model_hint, self.config.memory_hint_mib)
        for warning in found.warnings:
            log.warning("discovery: %s", warning)
        return found

    def _rediscover(self) -> None:
        """Refresh the topology, unless a source went missing (then the old view is better)."""
        self._discovered_at = self._clock()
        try:
            fresh = self._discover()
        except DiscoveryError as exc:
            log.warning("rediscovery failed, keeping the previous topology: %s", exc)
            return
        if fresh.sources.get("identity") != self.discovery.sources.get("identity"):
            log.warning("rediscovery lost NVML identity facts, keeping the previous topology")
            return
        self.discovery = fresh

    def _sample_gpus(self) -> list[HealthChange]:
        if self.reader is None:
            return []
        changes: list[HealthChange] = []
        samples: list[GpuSample] = []
        for gpu in self.topology.gpus:
            try:
                ident = self.reader.identity(gpu.index)
                util = self.reader.utilization(gpu.index)
                ecc = self.reader.ecc(gpu.index)
            except NvmlError as exc:
                lost = getattr(exc, "gpu_lost", False)
                change = self.tracker.record_fault(gpu.index, unreadable_fault(str(exc), lost))
            else:
                samples.append(
                    GpuSample(
                        gpu.index,
                        ident.uuid,
                        ident.memory_used_bytes,
                        ident.memory_total_bytes,
                        util.gpu_percent if util else None,
                    )
                )
                change = self.tracker.record_ecc(gpu.index, ecc)
            if change is not None:
                changes.append(change)
        self.metrics.observe_gpus(samples)
        return changes

    def _probe(self, index: int) -> tuple[bool, str]:
        """A re-check: the GPU answers NVML and its ECC state is within limits."""
        if self.reader is None:
            return True, "no NVML to check with"
        try:
            self.reader.identity(index)
            fault = ecc_fault(self.reader.ecc(index), self.tracker.policy.ecc)
        except NvmlError as exc:
            return False, str(exc)
        return (fault is None, fault.reason if fault else "readable, ECC within limits")

    def _refresh_cordons(self) -> tuple[HealthChange, ...]:
        if self.cluster is None:
            return ()
        try:
            raw = self.cluster.get_node_annotations(self.config.node_name).get(CORDON_ANNOTATION)
            cordoned = parse_cordon_annotation(raw)
        except KubeError as exc:
            log.warning("cannot read node annotations: %s", exc)
            return ()
        except CordonError as exc:
            if str(exc) != self._cordon_error:
                self._cordon_error = str(exc)
                log.error("%s; keeping the previous cordons", exc)
                self._emit(
                    AgentEvent("BadCordonAnnotation", str(exc), "Node", self.config.node_name, warning=True)
                )
            return ()
        self._cordon_error = ""
        for uuid in unknown_cordoned(cordoned, (g.uuid for g in self.topology.gpus)):
            log.warning("%s names %s, which is not a GPU of this node", CORDON_ANNOTATION, uuid)
        return self.tracker.set_cordoned(cordoned)

    def _police_memory(self) -> None:
        if self.watchdog is None or self.cluster is None:
            return
        try:
            pods = self.cluster.list_node_pods(self.config.node_name)
        except KubeError as exc:
            log.warning("cannot list pods for the memory watchdog: %s", exc)
            return
        report = self.watchdog.check(pods)
        self.metrics.observe_pods(report.usage)
        for warning in report.warnings:
            log.warning("watchdog: %s", warning)
        for v in report.new_violations:
            log.warning("watchdog: %s", v.message)
            self.metrics.count_over_limit(v.namespace, v.pod, v.gpu_index)
            self._emit(
                AgentEvent("GpuMemoryOverShare", v.message, "Pod", v.pod, v.namespace, v.pod_uid, True)
            )
        if report.killed:
            for v in report.violations:
                self.metrics.count_kill(v.namespace, v.pod, v.gpu_index)

    def _publish(self) -> None:
        health = self.tracker.snapshot()
        self.metrics.observe_health(health)
        for listener in self._health_listeners:
            try:
                listener(self.topology, health)
            except Exception:
                log.exception("a health listener failed")
        if self.publisher is None:
            return
        outcome = self.publisher.publish(self.topology, health)
        if outcome.error:
            self.metrics.publish_failed()
            log.warning("publishing the GpuTopology record failed (%s): %s", outcome.plan.why, outcome.error)
        elif outcome.wrote_status:
            self.metrics.published(self._clock())

    def _announce(self, changes: Sequence[HealthChange]) -> None:
        for change in changes:
            log.warning("%s", change.description)
            a = change.after
            reason = (
                "GpuCordonChanged"
                if change.before.cordoned != a.cordoned
                else ("GpuRecovered" if a.healthy else "GpuUnhealthy")
            )
            self._emit(
                AgentEvent(reason, change.description, "Node", self.config.node_name, warning=not a.healthy)
            )

    def _emit(self, event: AgentEvent) -> None:
        if self.cluster is None:
            return
        try:
            self.cluster.emit_event(event)
        except KubeError as exc:
            log.warning("cannot emit event %s: %s", event.reason, exc)

    def state(self) -> dict[str, Any]:
        return {
            "node": self.config.node_name,
            "topology": encode_topology(self.topology),
            "sources": dict(self.discovery.sources),
            "warnings": list(self.discovery.warnings),
            "gpuHealth": health_entries(self.tracker.snapshot()),
        }


# ----------------------------------------------------------------------------- wiring


def open_sources(
    config: AgentConfig,
) -> tuple[NvmlReader | None, SimulatedNvml | None, Callable[[], str | None]]:
    """(reader, the simulation if any, a function giving `topo -m` text or None)."""
    if config.simulate is not None:
        sim = SimulatedNvml.from_machine(config.simulate, node_name=config.node_name)
        text = simulated_topo_text(config.simulate)
        return sim, sim, lambda: text
    reader: NvmlReader | None = None
    try:
        reader = PynvmlReader.open()
    except NvmlUnavailable as exc:
        log.warning("NVML unavailable, relying on nvidia-smi topo -m: %s", exc)

    def topo_text() -> str | None:
        if not config.use_smi:
            return None
        try:
            return run_topo_matrix(config.nvidia_smi)
        except SmiError as exc:
            log.warning("%s", exc)
            return None

    return reader, None, topo_text


def simulated_topo_text(name_or_path: str) -> str | None:
    """The `topo -m` capture behind a simulated machine, so simulate mode merges both sources."""
    profile = MACHINES.get(name_or_path)
    path = topo_dir() / profile.file if profile is not None else Path(name_or_path)
    return path.read_text() if path.is_file() else None


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    logging.basicConfig(level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cluster: ClusterApi | None = None
    try:
        reader, simulated, topo_text = open_sources(config)
        if config.use_kube:
            cluster = KubernetesClusterApi.from_config(config.node_name, config.kubeconfig)
        agent = Agent(config, reader, cluster, AgentMetrics(), topo_text)
    except (CatalogError, DiscoveryError, KubeError, OSError) as exc:
        log.error("cannot start: %s", exc)
        return 2
    if config.print_discovery:
        print(json.dumps(agent.state(), indent=2, sort_keys=True))
        return 0
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server = (
        serve_http(agent, simulated, config.metrics_host, config.metrics_port)
        if config.metrics_port
        else None
    )
    agent.poll()
    stop_plugins = start_device_plugins(DevicePluginContext(config, agent, reader, cluster, stop))
    log.info("agent running on node %s with %d GPUs", config.node_name, agent.topology.gpu_count)
    try:
        agent.run(stop)
    finally:
        log.info("agent stopping")
        if stop_plugins is not None:
            stop_plugins()
        if server is not None:
            server.shutdown()
        if reader is not None:
            reader.close()
    return 0
