"""Prometheus metrics of the node agent (the only node_agent module importing prometheus_client).

Each agent owns a `CollectorRegistry`, so tests (and several agents in one process) never
share series. `render()` gives the exposition text for the agent's own /metrics endpoint. The
device plugins' counts arrive as plain numbers (`DevicePluginStats`), so this module depends on
nothing but the health types.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from node_agent.health import GpuHealth, Severity


@dataclass(frozen=True, slots=True)
class GpuSample:
    index: int
    uuid: str
    memory_used_bytes: int
    memory_total_bytes: int
    utilization_percent: int | None


@dataclass(frozen=True, slots=True)
class PodGpuMemory:
    """What one pod was granted on one GPU and what its processes use there."""

    namespace: str
    pod: str
    gpu_index: int
    allocated_bytes: int
    used_bytes: int


@dataclass(frozen=True)
class DevicePluginStats:
    """The device plugins' own counts, read at scrape time."""

    allocations: int = 0
    refusals: int = 0
    id_mismatches: int = 0  # the kubelet passed other devices than the record's
    enforcement_disagreements: int = 0  # the node could not apply the record's enforcement
    fallbacks: tuple[tuple[str, int], ...] = ()  # of those, (the record's level, count)
    applied: tuple[tuple[str, int], ...] = ()  # handouts by the enforcement level applied
    swaps: int = 0
    unresolved: int = 0
    adopted: int = 0
    write_failures: int = 0
    resources: int = 0  # plugin servers running (one per resource)
    registrations: int = 0  # successful registrations with the kubelet


class _DevicePluginCollector(Collector):
    """Exports `DevicePluginStats` (kept by the broker as plain numbers) when scraped."""

    def __init__(self) -> None:
        self.source: Callable[[], DevicePluginStats | None] = lambda: None

    def collect(self) -> Iterator[Metric]:
        c = self.source() or DevicePluginStats()
        allocations = CounterMetricFamily(
            "linkpack_agent_allocations",
            "Allocate requests of the kubelet, by result (granted from a record, or refused)",
            labels=["result"],
        )
        allocations.add_metric(["granted"], c.allocations)
        allocations.add_metric(["refused"], c.refusals)
        yield allocations
        mismatches = CounterMetricFamily(
            "linkpack_agent_allocation_mismatches",
            "Grants where the kubelet's devices (device_ids) disagreed with the allocation record, "
            "or the node could not apply its enforcement (enforcement)",
            labels=["kind"],
        )
        mismatches.add_metric(["device_ids"], c.id_mismatches)
        mismatches.add_metric(["enforcement"], c.enforcement_disagreements)
        yield mismatches
        fallbacks = CounterMetricFamily(
            "linkpack_agent_enforcement_fallbacks",
            "Share handouts held cooperatively because the node could not apply the record's level "
            "(MPS not serving, the CUDA interposer not installed), by the record's level",
            labels=["recorded"],
        )
        for recorded, count in c.fallbacks:
            fallbacks.add_metric([recorded], count)
        yield fallbacks
        applied = CounterMetricFamily(
            "linkpack_agent_allocations_by_enforcement",
            "Containers handed GPUs, by the enforcement level applied (none, mig, cooperative, "
            "interposer, hard-mps)",
            labels=["enforcement"],
        )
        for level, count in c.applied:
            applied.add_metric([level], count)
        yield applied
        for name, help_text, value in (
            ("linkpack_agent_allocation_swaps", "Records swapped to match the kubelet's account", c.swaps),
            (
                "linkpack_agent_allocation_unresolved",
                "Cases the kubelet's account could not be squared with the records",
                c.unresolved,
            ),
            ("linkpack_agent_allocations_adopted", "Handouts learned from the kubelet's account", c.adopted),
            (
                "linkpack_agent_allocation_write_failures",
                "Failed write-backs of consumed or rewritten records (retried)",
                c.write_failures,
            ),
            (
                "linkpack_agent_device_plugin_registrations",
                "Registrations of a device plugin with the kubelet",
                c.registrations,
            ),
        ):
            yield CounterMetricFamily(name, help_text, value=value)
        yield GaugeMetricFamily(
            "linkpack_agent_device_plugin_resources",
            "Device-plugin resources served to the kubelet (0: device plugins off)",
            value=c.resources,
        )


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self._device_plugins = _DevicePluginCollector()
        r.register(self._device_plugins)
        gpu = ("gpu", "uuid")
        self.utilization = Gauge(
            "linkpack_gpu_utilization_percent",
            "Percent of NVML's last sample period in which a kernel ran on the GPU",
            gpu,
            registry=r,
        )
        self.memory_used = Gauge(
            "linkpack_gpu_memory_used_bytes",
            "GPU memory in use, all processes and the driver (NVML)",
            gpu,
            registry=r,
        )
        self.memory_total = Gauge(
            "linkpack_gpu_memory_total_bytes", "GPU memory size (NVML)", gpu, registry=r
        )
        self.healthy = Gauge(
            "linkpack_gpu_healthy",
            "1 when the GPU is healthy, 0 while the agent keeps it out of service (XID, ECC, unreadable)",
            gpu,
            registry=r,
        )
        self.cordoned = Gauge(
            "linkpack_gpu_cordoned",
            "1 when the node's linkpack.io/cordoned-gpus annotation names the GPU",
            gpu,
            registry=r,
        )
        self.xids = Counter(
            "linkpack_gpu_xid_events",
            "XID and ECC events of the driver (xid 0: an ECC event), by the severity the agent gave them",
            (*gpu, "xid", "severity"),
            registry=r,
        )
        pod = ("namespace", "pod", "gpu")
        self.pod_allocated = Gauge(
            "linkpack_pod_gpu_memory_allocated_bytes", "GPU memory granted to the pod", pod, registry=r
        )
        self.pod_used = Gauge(
            "linkpack_pod_gpu_memory_used_bytes", "GPU memory the pod's processes use", pod, registry=r
        )
        self.over_limit = Counter(
            "linkpack_pod_gpu_memory_over_limit",
            "Times a pod was found above its GPU memory share, by the enforcement level of its record "
            "(expected under cooperative; under interposer, hard-mps or mig a bug to report)",
            (*pod, "enforcement"),
            registry=r,
        )
        self.kills = Counter(
            "linkpack_watchdog_kills",
            "Watchdog polls that killed a pod's processes on a GPU for exceeding its memory share "
            "(--watchdog-kill)",
            pod,
            registry=r,
        )
        self.heartbeat = Gauge(
            "linkpack_agent_last_publish_timestamp_seconds",
            "Unix time of the last successful write of the node's GpuTopology status (0: none since start)",
            registry=r,
        )
        self.publish_errors = Counter(
            "linkpack_agent_publish_errors",
            "Failed writes of the node's GpuTopology (spec or status)",
            registry=r,
        )

    def observe_gpus(self, samples: Iterable[GpuSample]) -> None:
        for s in samples:
            labels = (str(s.index), s.uuid)
            self.memory_used.labels(*labels).set(s.memory_used_bytes)
            self.memory_total.labels(*labels).set(s.memory_total_bytes)
            if s.utilization_percent is not None:
                self.utilization.labels(*labels).set(s.utilization_percent)

    def observe_health(self, health: Sequence[GpuHealth]) -> None:
        for h in health:
            labels = (str(h.index), h.uuid)
            self.healthy.labels(*labels).set(1 if h.healthy else 0)
            self.cordoned.labels(*labels).set(1 if h.cordoned else 0)

    def count_xid(self, index: int, uuid: str, xid: int, severity: Severity) -> None:
        self.xids.labels(str(index), uuid, str(xid), severity.value).inc()

    def observe_pods(self, usage: Iterable[PodGpuMemory]) -> None:
        """Replace the per-pod series with the current ones (finished pods disappear)."""
        self.pod_allocated.clear()
        self.pod_used.clear()
        for u in usage:
            labels = (u.namespace, u.pod, str(u.gpu_index))
            self.pod_allocated.labels(*labels).set(u.allocated_bytes)
            self.pod_used.labels(*labels).set(u.used_bytes)

    def count_over_limit(self, namespace: str, pod: str, gpu_index: int, enforcement: str = "") -> None:
        self.over_limit.labels(namespace, pod, str(gpu_index), enforcement).inc()

    def count_kill(self, namespace: str, pod: str, gpu_index: int) -> None:
        self.kills.labels(namespace, pod, str(gpu_index)).inc()

    def watch_device_plugins(self, source: Callable[[], DevicePluginStats | None]) -> None:
        """Where the device plugins' counts are read from at each scrape (None: not running)."""
        self._device_plugins.source = source

    def published(self, when: float) -> None:
        self.heartbeat.set(when)

    def publish_failed(self) -> None:
        self.publish_errors.inc()

    def render(self) -> tuple[bytes, str]:
        """(body, content type) for a /metrics response."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
