"""A recording `NodeApi` fake and a settable clock for the node agent's tests."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from contract.gpu_topology import (
    PublishedTopology,
    TopologyStatus,
    decode_gpu_topology,
    encode_status,
    topology_object,
)
from node_agent.kube.node_api import AgentEvent, KubeConflict, KubeError, KubeNotFound, NodeMetadata, PodInfo
from topology.codec import content_hash
from topology.model import NodeTopology


class FakeNodeApi:
    """`NodeApi` in memory, recording every write; `fail_next` makes the next call fail.

    The GpuTopology goes through the contract's encoders and decoder as over the real API:
    `spec` is the encoded spec, `status` the encoded status (as JSON), `published` the decoded
    status. Pod annotation patches check the resourceVersion precondition like the API server
    and bump it; `before_pod_patch` runs first (to play a concurrent writer).
    """

    def __init__(self, node: str = "n1") -> None:
        self.node_annotations: dict[str, str] = {}
        self.node_labels: dict[str, str] = {}
        self.node_version = 1  # the Node's resourceVersion, bumped by every write to it
        self.label_patches: list[tuple[dict[str, str | None], dict[str, str | None], str]] = []
        self.spec: dict[str, Any] | None = None
        self.spec_hash = ""
        self.status: dict[str, Any] = {}
        self.published: TopologyStatus | None = None
        self.pods: list[PodInfo] = []
        self.events: list[AgentEvent] = []
        self.spec_writes = 0
        self.status_writes = 0
        self.fail_next = False
        self.pod_reads = 0
        self.pod_patches: list[tuple[str, str, dict[str, str | None], str]] = []
        self.before_pod_patch: Callable[[], None] | None = None

    def _maybe_fail(self, what: str) -> None:
        if self.fail_next:
            self.fail_next = False
            raise KubeError(f"{what}: HTTP 500 injected", 500)

    def get_node_annotations(self, node: str) -> Mapping[str, str]:
        self._maybe_fail("get node")
        return dict(self.node_annotations)

    def patch_node_annotations(self, node: str, changes: Mapping[str, str | None]) -> None:
        self._maybe_fail("patch node")
        _merge(self.node_annotations, changes)
        self.node_version += 1

    def get_node_metadata(self, node: str) -> NodeMetadata:
        self._maybe_fail("get node")
        return NodeMetadata(
            MappingProxyType(dict(self.node_labels)),
            MappingProxyType(dict(self.node_annotations)),
            str(self.node_version),
        )

    def patch_node_labels(
        self,
        node: str,
        labels: Mapping[str, str | None],
        annotations: Mapping[str, str | None],
        resource_version: str,
    ) -> None:
        self._maybe_fail("patch node labels")
        self.label_patches.append((dict(labels), dict(annotations), resource_version))
        if resource_version and resource_version != str(self.node_version):
            raise KubeConflict(f"patch node {node}: HTTP 409 Conflict", 409)
        _merge(self.node_labels, labels)
        _merge(self.node_annotations, annotations)
        self.node_version += 1

    def label_node(self, changes: Mapping[str, str | None]) -> None:
        """Another writer (an operator, GPU Feature Discovery) sets (value) or removes (None) labels."""
        _merge(self.node_labels, changes)
        self.node_version += 1

    def get_topology(self, node: str) -> PublishedTopology | None:
        self._maybe_fail("get topology")
        if self.spec is None:
            return None
        obj = {
            "metadata": {"name": node, "resourceVersion": "1"},
            "spec": self.spec,
            "status": self.status or None,
        }
        return decode_gpu_topology(obj)

    def put_topology_spec(self, node: str, topology: NodeTopology) -> None:
        self._maybe_fail("put spec")
        self.spec = dict(topology_object(node, topology)["spec"])
        self.spec_hash = content_hash(topology)
        self.spec_writes += 1

    def patch_topology_status(self, node: str, status: TopologyStatus) -> None:
        self._maybe_fail("patch status")
        self.status = encode_status(status)
        self.published = status
        self.status_writes += 1

    def list_node_pods(self, node: str) -> tuple[PodInfo, ...]:
        self._maybe_fail("list pods")
        return tuple(self.pods)

    def get_pod(self, namespace: str, name: str) -> PodInfo | None:
        self._maybe_fail("get pod")
        self.pod_reads += 1
        return next((p for p in self.pods if (p.namespace, p.name) == (namespace, name)), None)

    def patch_pod_annotations(
        self, namespace: str, name: str, changes: Mapping[str, str | None], resource_version: str
    ) -> PodInfo:
        self._maybe_fail("patch pod")
        self.pod_patches.append((namespace, name, dict(changes), resource_version))
        if self.before_pod_patch is not None:
            self.before_pod_patch()
        current = self.get_pod(namespace, name)
        self.pod_reads -= 1
        if current is None:
            raise KubeNotFound(f"patch pod {namespace}/{name}: HTTP 404 Not Found", 404)
        if resource_version and resource_version != current.resource_version:
            raise KubeConflict(f"patch pod {namespace}/{name}: HTTP 409 Conflict", 409)
        annotations = dict(current.annotations)
        for key, value in changes.items():
            if value is None:
                annotations.pop(key, None)
            else:
                annotations[key] = value
        return self.replace_pod(current, annotations=MappingProxyType(annotations))

    def replace_pod(self, pod: PodInfo, **changes: Any) -> PodInfo:
        """Store a changed copy of `pod` under a new resourceVersion (what any write does)."""
        version = str(int(pod.resource_version or "0") + 1)
        new = dataclasses.replace(pod, resource_version=version, **changes)
        self.pods = [new if p is pod else p for p in self.pods]
        return new

    def emit_event(self, event: AgentEvent) -> None:
        self._maybe_fail("event")
        self.events.append(event)


def _merge(target: dict[str, str], changes: Mapping[str, str | None]) -> None:
    for k, v in changes.items():
        if v is None:
            target.pop(k, None)
        else:
            target[k] = v


class FakeClock:
    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
