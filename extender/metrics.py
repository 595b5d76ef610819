"""Prometheus metrics of the extender (the only module that imports prometheus_client)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from topology.scheduling import NodeState

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class _CapacityCollector(Collector):
    """Allocated and free GPU capacity per node and GPU model, computed at scrape time."""

    def __init__(self, nodes: Callable[[], Iterable[NodeState]]) -> None:
        self._nodes = nodes

    def collect(self) -> Iterable[Metric]:
        gpus = GaugeMetricFamily(
            "linkpack_gpus",
            "GPUs by node, model and state: free, shared (shares or MIG instances granted), "
            "allocated (granted whole), unavailable (unhealthy or cordoned)",
            labels=["node", "model", "state"],
        )
        memory = GaugeMetricFamily(
            "linkpack_gpu_memory_mib",
            "GPU memory in MiB by node, model and state: free (still grantable on usable GPUs), "
            "allocated (granted)",
            labels=["node", "model", "state"],
        )
        for node in self._nodes():
            counts: dict[tuple[str, str], int] = {}
            mem: dict[tuple[str, str], int] = {}
            for gpu, usage in zip(node.topology.gpus, node.usage, strict=True):
                if not usage.usable:
                    state = "unavailable"
                elif usage.whole:
                    state = "allocated"
                elif usage.idle:
                    state = "free"
                else:
                    state = "shared"
                counts[(gpu.model, state)] = counts.get((gpu.model, state), 0) + 1
                free = node.free_memory_mib(gpu.index) if usage.usable else 0
                mem[(gpu.model, "free")] = mem.get((gpu.model, "free"), 0) + free
                mem[(gpu.model, "allocated")] = mem.get((gpu.model, "allocated"), 0) + (
                    gpu.memory_mib if usage.whole else usage.memory_used_mib
                )
            for (model, state), n in sorted(counts.items()):
                gpus.add_metric([node.name, model, state], n)
            for (model, state), n in sorted(mem.items()):
                memory.add_metric([node.name, model, state], n)
        yield gpus
        yield memory


class _MissingTopologyCollector(Collector):
    """1 for every node whose kubelet advertises GPUs but that has no topology record."""

    def __init__(self, missing: Callable[[], Iterable[str]]) -> None:
        self._missing = missing

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            "linkpack_node_topology_missing",
            "GPU nodes without a (valid) GpuTopology record: GPU pods can never be placed there",
            labels=["node"],
        )
        for node in self._missing():
            family.add_metric([node], 1)
        yield family


class ExtenderMetrics:
    def __init__(
        self, nodes: Callable[[], Iterable[NodeState]], missing_topology: Callable[[], Iterable[str]] = tuple
    ) -> None:
        self.registry = CollectorRegistry()
        self.latency = Histogram(
            "linkpack_extender_request_seconds",
            "Time to answer a scheduler call, by verb",
            ["verb"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.decisions = Counter(
            "linkpack_extender_decisions_total",
            "Filter outcomes per node, and bind outcomes, by verb, outcome and reason",
            ["verb", "outcome", "reason"],
            registry=self.registry,
        )
        self.bind_failures = Counter(
            "linkpack_extender_bind_failures_total",
            "Binds that failed, by the error (its text after the first colon, at most 60 characters)",
            ["reason"],
            registry=self.registry,
        )
        self.rollbacks = Counter(
            "linkpack_extender_rollbacks_total",
            "Ledger entries released, by reason: a failed bind, a reservation never used, or a pod "
            "that left (deleted, finished, re-created)",
            ["reason"],
            registry=self.registry,
        )
        self.bind_conflicts = Counter(
            "linkpack_extender_bind_conflicts_total",
            "Ledger commits retried after a concurrent writer won",
            registry=self.registry,
        )
        self.registry.register(_CapacityCollector(nodes))
        self.registry.register(_MissingTopologyCollector(missing_topology))

    def render(self) -> bytes:
        return generate_latest(self.registry)
