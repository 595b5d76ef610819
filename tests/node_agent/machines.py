"""Catalog machines with their `topo -m` text, a recording cluster fake and a settable clock."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from node_agent.kube import AgentEvent, KubeError, PodInfo, TopologyRecord
from topology.catalog import MACHINES, load_machine, topo_dir
from topology.model import NodeTopology


def topo_text(name: str) -> str:
    """The `nvidia-smi topo -m` capture of a catalog machine."""
    return (topo_dir() / MACHINES[name].file).read_text()


def machine(name: str) -> NodeTopology:
    return load_machine(name)


class FakeCluster:
    """`ClusterApi` in memory, recording every write; `fail_next` makes the next call fail."""

    def __init__(self, node: str = "n1") -> None:
        self.node_annotations: dict[str, str] = {}
        self.record: dict[str, Any] | None = None
        self.record_hash = ""
        self.status: dict[str, Any] = {}
        self.pods: list[PodInfo] = []
        self.events: list[AgentEvent] = []
        self.spec_writes = 0
        self.status_writes = 0
        self.fail_next = False

    def _maybe_fail(self, what: str) -> None:
        if self.fail_next:
            self.fail_next = False
            raise KubeError(f"{what}: HTTP 500 injected", 500)

    def get_node_annotations(self, node: str) -> Mapping[str, str]:
        self._maybe_fail("get node")
        return dict(self.node_annotations)

    def patch_node_annotations(self, node: str, changes: Mapping[str, str | None]) -> None:
        self._maybe_fail("patch node")
        for k, v in changes.items():
            if v is None:
                self.node_annotations.pop(k, None)
            else:
                self.node_annotations[k] = v

    def get_topology(self, node: str) -> TopologyRecord | None:
        self._maybe_fail("get topology")
        if self.record is None:
            return None
        return TopologyRecord(node, self.record, self.status, self.record_hash, "1")

    def put_topology_spec(self, node: str, spec: Mapping[str, Any], content_hash: str) -> None:
        self._maybe_fail("put spec")
        self.record = dict(spec)
        self.record_hash = content_hash
        self.spec_writes += 1

    def patch_topology_status(self, node: str, status: Mapping[str, Any]) -> None:
        self._maybe_fail("patch status")
        self.status = dict(status)
        self.status_writes += 1

    def list_node_pods(self, node: str) -> tuple[PodInfo, ...]:
        self._maybe_fail("list pods")
        return tuple(self.pods)

    def patch_pod_annotations(
        self, namespace: str, name: str, changes: Mapping[str, str | None], resource_version: str
    ) -> PodInfo:
        raise NotImplementedError

    def emit_event(self, event: AgentEvent) -> None:
        self._maybe_fail("event")
        self.events.append(event)


class FakeClock:
    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
