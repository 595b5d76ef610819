"""The node agent loop: discover, watch health, follow cordons, police memory, publish.

`Agent` owns the decisions of one node and is driven by `run` (or by `poll` / `handle_event`
directly in tests). Each poll samples the GPUs, re-checks unhealthy ones, reads the cordon
annotation (`contract.cordons`), rediscovers now and then, runs the memory watchdog, holds
GPUs at their pods' power budgets (`power`, with `--set-power-limits`), keeps the node's
labels (`node_labels`) and publishes the GpuTopology status (`publisher`), which also carries
the driver and CUDA versions, the power limits and the heartbeat. Listeners
(the device plugins, see `wiring`) are told the topology and health after every poll and every
health change. It is built by `wiring` and knows nothing of HTTP or gRPC.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from contract.cordons import parse_cordons
from contract.gpu_topology import TopologyStatus, encode_status
from contract.handoff import NodeHolds
from contract.keys import CORDON_ANNOTATION
from node_agent.config import AgentConfig, agent_version
from node_agent.health import (
    GpuHealth,
    HealthChange,
    HealthRules,
    HealthTracker,
    ecc_fault,
    unreadable_fault,
)
from node_agent.kube.node_api import AgentEvent, KubeError, NodeApi
from node_agent.loop.node_labels import LabelFacts, NodeLabeler, node_labels
from node_agent.loop.power import PowerLimiter, plan_power_limits
from node_agent.loop.publisher import Publisher, node_status
from node_agent.loop.watchdog import Watchdog
from node_agent.metrics import AgentMetrics, GpuSample
from node_agent.sharing.mps import ExternalMps, MpsService
from node_agent.sources.discovery import Discovery, DiscoveryError, discover
from node_agent.sources.driver_power import DriverReading, PowerReading, read_driver, read_power
from node_agent.sources.nvml_reader import NvmlError, NvmlReader, XidEvent
from topology.codec import encode_topology
from topology.model import NodeTopology

log = logging.getLogger(__name__)

#: Told the topology and GPU health after every poll and every health change.
HealthListener = Callable[[NodeTopology, tuple[GpuHealth, ...]], None]


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        reader: NvmlReader | None,
        api: NodeApi | None,
        metrics: AgentMetrics,
        topo_text: Callable[[], str | None] = lambda: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.reader = reader
        self.api = api
        self.metrics = metrics
        self._topo_text = topo_text
        self._clock = clock
        self._version = agent_version()
        self.discovery = self._discover()
        gpus = [(g.index, g.uuid) for g in self.topology.gpus]
        policy = HealthRules(
            recheck_after_s=config.recheck_after_s,
            fatal_recheck_after_s=config.fatal_recheck_after_s,
            xid_overrides=dict(config.xid_overrides),
        )
        self.tracker = HealthTracker(gpus, policy, clock)
        self.publisher = (
            Publisher(api, config.node_name, config.heartbeat_interval_s, clock) if api is not None else None
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
        self._cordon_problems: tuple[str, ...] = ()
        self.driver: DriverReading = self._read_driver()
        self.power: PowerReading = read_power(reader, (g.index for g in self.topology.gpus))
        self.labeler = NodeLabeler(api, config.node_name) if api is not None and config.node_labels else None
        self._label_conflicts: tuple[str, ...] = ()
        self.power_limiter = PowerLimiter(reader) if reader is not None and config.set_power_limits else None
        self._health_listeners: list[HealthListener] = []
        # MPS and the CUDA interposer as `wiring` sets them up: checked at every poll, published
        self.mps: MpsService = ExternalMps(config.mps_pipe_dir)
        self.interposer_ready: Callable[[], bool] = lambda: False
        self.last_loop_at = clock()
        if self.publisher is not None:
            self.publisher.load_existing()
        # What the node holds (`contract.handoff`): until the device plugins have asked the
        # kubelet, what the object said at start, so a restart releases nothing unconfirmed;
        # `wiring` points this at the plugins, or at nothing when they do not run.
        inherited = self.publisher.inherited_holds if self.publisher is not None else None
        self.node_holds: Callable[[], NodeHolds | None] = lambda: inherited

    @property
    def topology(self) -> NodeTopology:
        return self.discovery.topology

    def health(self) -> tuple[GpuHealth, ...]:
        return self.tracker.current()

    def status(self) -> TopologyStatus:
        """The GpuTopology status this node publishes now (without its heartbeat)."""
        return node_status(
            self.topology,
            self.tracker.current(),
            self._version,
            mps_active=self.mps.active,
            interposer_available=self.interposer_ready(),
            cordon_problems=self._cordon_problems,
            driver_version=self.driver.driver_version,
            cuda_driver_version=self.driver.cuda_driver_version,
            power=self.power.limits,
            label_conflicts=self._label_conflicts,
            holds=self.node_holds(),
        )

    def add_health_listener(self, listener: HealthListener) -> None:
        """Call `listener(topology, health)` after every poll and every health change."""
        self._health_listeners.append(listener)

    def stalled(self) -> bool:
        """The loop has not polled for a while (for /healthz)."""
        return self._clock() - self.last_loop_at > 3 * self.config.poll_interval_s + 30

    def state(self) -> dict[str, Any]:
        """What /debug/state shows: the topology, where its facts came from, and the status."""
        return {
            "node": self.config.node_name,
            "topology": encode_topology(self.topology),
            "sources": dict(self.discovery.sources),
            "warnings": list(self.discovery.warnings),
            "status": encode_status(self.status(), with_heartbeat=False),
        }

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
        if event.gpu_index not in {h.index for h in self.tracker.current()}:
            log.warning("event for GPU %d, which this agent does not track: %s", event.gpu_index, event)
            return
        fault, change = self.tracker.observe_xid(event)
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
            change = self.tracker.observe_recheck(index, passed, detail)
            if change is not None:
                changes.append(change)
        changes.extend(self._refresh_cordons())
        if self._clock() - self._discovered_at >= self.config.rediscover_interval_s:
            self._rediscover()
        self._announce(changes)
        self._police_memory()
        self.mps.check()  # a supervised daemon found dead is restarted here (with back-off)
        self._apply_power_budgets()
        self.power = read_power(self.reader, (g.index for g in self.topology.gpus))
        self._refresh_labels()
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
        self.driver = self._read_driver()

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
                change = self.tracker.apply_fault(gpu.index, unreadable_fault(str(exc), lost))
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
                change = self.tracker.observe_ecc(gpu.index, ecc)
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
        """Follow the cordon annotation. Its valid entries are cordoned; what is wrong with the
        others (and cordons of GPUs this node does not have) is published in the status and
        raised as a Node event when it changes. When the node cannot be read, nothing changes."""
        if self.api is None:
            return ()
        try:
            raw = self.api.get_node_annotations(self.config.node_name).get(CORDON_ANNOTATION)
        except KubeError as exc:
            log.warning("cannot read node annotations: %s", exc)
            return ()
        cordons = parse_cordons(raw)
        unknown = cordons.unknown(g.uuid for g in self.topology.gpus)
        problems = (
            *cordons.problems,
            *(f"{CORDON_ANNOTATION}: {uuid} is not a GPU of this node" for uuid in unknown),
        )
        if problems != self._cordon_problems:
            self._cordon_problems = problems
            if problems:
                message = "; ".join(problems)
                log.error("%s", message)
                self._emit(
                    AgentEvent("BadCordonAnnotation", message, "Node", self.config.node_name, warning=True)
                )
        return self.tracker.set_cordoned(cordons.uuids)

    def _police_memory(self) -> None:
        if self.watchdog is None or self.api is None:
            return
        try:
            pods = self.api.list_node_pods(self.config.node_name)
        except KubeError as exc:
            log.warning("cannot list pods for the memory watchdog: %s", exc)
            return
        report = self.watchdog.check(pods)
        self.metrics.observe_pods(report.usage)
        for warning in report.warnings:
            log.warning("watchdog: %s", warning)
        for v in report.new_violations:
            log.warning("watchdog: %s", v.message)
            self.metrics.count_over_limit(v.namespace, v.pod, v.gpu_index, v.enforcement)
            self._emit(
                AgentEvent("GpuMemoryOverShare", v.message, "Pod", v.pod, v.namespace, v.pod_uid, True)
            )
        if report.killed:
            for v in report.violations:
                self.metrics.count_kill(v.namespace, v.pod, v.gpu_index)

    def _read_driver(self) -> DriverReading:
        found = read_driver(self.reader)
        for problem in found.problems:
            log.warning("%s", problem)
        return found

    def _apply_power_budgets(self) -> None:
        """With --set-power-limits: GPUs of pods with a power budget at it, the others at default."""
        if self.power_limiter is None or self.api is None:
            return
        try:
            pods = self.api.list_node_pods(self.config.node_name)
        except KubeError as exc:
            log.warning("cannot list pods for their power budgets, limits left as they are: %s", exc)
            return
        now = read_power(self.reader, (g.index for g in self.topology.gpus))
        plan = plan_power_limits(pods, self.config.node_name, self.topology.gpus, dict(now.limits))
        self.power_limiter.apply(plan)

    def _refresh_labels(self) -> None:
        """Keep the node's labels (`node_labels`); conflicts go to the status and a Node event."""
        if self.labeler is None:
            return
        facts = LabelFacts(self.driver.driver_version, self.driver.cuda_driver_version, self.mps.active)
        outcome = self.labeler.reconcile(node_labels(self.topology, facts))
        if outcome.error or outcome.plan is None:
            log.warning("node labels: %s", outcome.error)
            return
        if outcome.wrote:
            log.info("node labels changed: %s", dict(outcome.plan.labels))
        reports = outcome.plan.reports
        if reports != self._label_conflicts:
            self._label_conflicts = reports
            if reports:
                message = "; ".join(reports)
                log.warning("%s", message)
                self._emit(AgentEvent("LabelConflict", message, "Node", self.config.node_name, warning=True))

    def publish_now(self) -> None:
        """Publish the current status now (e.g. before the device plugins stop)."""
        self._publish()

    def _publish(self) -> None:
        health = self.tracker.current()
        self.metrics.observe_health(health)
        for listener in self._health_listeners:
            try:
                listener(self.topology, health)
            except Exception:
                log.exception("a health listener failed")
        if self.publisher is None:
            return
        outcome = self.publisher.publish(self.topology, self.status())
        if outcome.error:
            self.metrics.publish_failed()
            log.warning("publishing the GpuTopology failed (%s): %s", outcome.plan.why, outcome.error)
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
        if self.api is None:
            return
        try:
            self.api.emit_event(event)
        except KubeError as exc:
            log.warning("cannot emit event %s: %s", event.reason, exc)
