"""What the node agent needs from the Kubernetes API, as `NodeApi`, and the pure translation of
API objects into our frozen types. Nothing here imports the `kubernetes` client: the adapter
over it is `node_agent.kube.client.KubernetesNodeApi`, and only `wiring` builds one.

`NodeApi` is this node's view (its labels and annotations, its GpuTopology, its pods, events about it); it
is not the extender's cluster-wide `ClusterApi`. Objects cross the seam as plain JSON-shaped
dicts; every client failure becomes `KubeError` (`KubeConflict` for 409, `KubeNotFound` for 404).
The GpuTopology object and its status are `contract.gpu_topology`'s.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from contract.gpu_topology import PublishedTopology, TopologyStatus
from contract.keys import AGENT_COMPONENT
from contract.pod_demand import ContainerDemand, PodSpecError, container_demands
from contract.pods import FINISHED_PHASES
from topology.model import NodeTopology


class KubeError(Exception):
    """A Kubernetes API call failed. `status` is the HTTP status when there was one."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class KubeConflict(KubeError):
    """409: the object changed since it was read (resourceVersion precondition failed)."""


class KubeNotFound(KubeError):
    """404: the object does not exist."""


@dataclass(frozen=True, slots=True)
class PodInfo:
    """A pod as the agent reads it.

    `demands`: what its containers ask of the resources the agent was built to read (init
    containers, plain and sidecar, then app containers, each in spec order). `spec_problem`
    says why they could not be read (a quantity that is not a whole number); `demands` is then
    empty, so the pod asks for nothing the device plugin serves.
    """

    namespace: str
    name: str
    uid: str
    resource_version: str = ""
    node_name: str = ""
    phase: str = ""
    annotations: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    demands: tuple[ContainerDemand, ...] = ()
    created: dt.datetime | None = None
    scheduled_at: dt.datetime | None = None  # the PodScheduled=True condition's transition time
    spec_problem: str = ""

    @property
    def finished(self) -> bool:
        return self.phase in FINISHED_PHASES

    @property
    def bound_at(self) -> dt.datetime | None:
        """When the pod was bound to its node, as well as the API tells: scheduled, else created."""
        return self.scheduled_at or self.created


@dataclass(frozen=True, slots=True)
class NodeMetadata:
    """A Node's labels and annotations, and the resourceVersion they were read at."""

    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    annotations: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    resource_version: str = ""


@dataclass(frozen=True, slots=True)
class AgentEvent:
    """A Kubernetes Event about a Node or a Pod."""

    reason: str  # CamelCase, e.g. "GpuUnhealthy"
    message: str
    object_kind: str  # "Node" or "Pod"
    name: str
    namespace: str = ""
    uid: str = ""
    warning: bool = False


class NodeApi(Protocol):
    """The API as one node agent uses it (see the module docstring)."""

    def get_node_annotations(self, node: str) -> Mapping[str, str]: ...

    def patch_node_annotations(self, node: str, changes: Mapping[str, str | None]) -> None:
        """Set (value) or remove (None) annotations on the node."""
        ...

    def get_node_metadata(self, node: str) -> NodeMetadata:
        """The node's labels and annotations as the API server holds them now."""
        ...

    def patch_node_labels(
        self,
        node: str,
        labels: Mapping[str, str | None],
        annotations: Mapping[str, str | None],
        resource_version: str,
    ) -> None:
        """Set (value) or remove (None) labels and annotations of the node in one merge patch;
        `KubeConflict` if the node's resourceVersion moved on (when one is given)."""
        ...

    def get_topology(self, node: str) -> PublishedTopology | None:
        """The node's GpuTopology; None when there is none. KubeError when it cannot be read or
        decoded (a malformed object is rewritten by the next spec write)."""
        ...

    def put_topology_spec(self, node: str, topology: NodeTopology) -> None:
        """Create the node's GpuTopology, or replace its spec if it exists."""
        ...

    def patch_topology_status(self, node: str, status: TopologyStatus) -> None: ...

    def list_node_pods(self, node: str) -> tuple[PodInfo, ...]: ...

    def get_pod(self, namespace: str, name: str) -> PodInfo | None:
        """The pod as the API server holds it now; None when it does not exist."""
        ...

    def patch_pod_annotations(
        self, namespace: str, name: str, changes: Mapping[str, str | None], resource_version: str
    ) -> PodInfo:
        """Merge-patch annotations; `KubeConflict` if the pod's resourceVersion moved on."""
        ...

    def emit_event(self, event: AgentEvent) -> None: ...


# ----------------------------------------------------------------------------- pure translation


def rfc3339(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_from_dict(obj: Mapping[str, Any], wanted: Callable[[str], bool]) -> PodInfo:
    """A pod given as JSON; container resources are read only for names `wanted` accepts."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    try:
        demands, problem = container_demands(spec, wanted), ""
    except PodSpecError as exc:
        demands, problem = (), str(exc)
    return PodInfo(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
        node_name=str(spec.get("nodeName") or ""),
        phase=str(status.get("phase") or ""),
        annotations=MappingProxyType({str(k): str(v) for k, v in (meta.get("annotations") or {}).items()}),
        demands=demands,
        created=_timestamp(meta.get("creationTimestamp")),
        scheduled_at=_scheduled_at(status.get("conditions")),
        spec_problem=problem,
    )


def node_metadata_from_dict(obj: Mapping[str, Any]) -> NodeMetadata:
    """A Node given as JSON: its labels, annotations and resourceVersion."""
    meta = obj.get("metadata") or {}
    return NodeMetadata(
        labels=MappingProxyType({str(k): str(v) for k, v in (meta.get("labels") or {}).items()}),
        annotations=MappingProxyType({str(k): str(v) for k, v in (meta.get("annotations") or {}).items()}),
        resource_version=str(meta.get("resourceVersion") or ""),
    )


def node_metadata_patch(
    labels: Mapping[str, str | None], annotations: Mapping[str, str | None], resource_version: str
) -> dict[str, Any]:
    """The merge patch that changes these labels and annotations (None removes one)."""
    metadata: dict[str, Any] = {}
    if labels:
        metadata["labels"] = dict(labels)
    if annotations:
        metadata["annotations"] = dict(annotations)
    if resource_version:
        metadata["resourceVersion"] = resource_version
    return {"metadata": metadata}


def event_body(event: AgentEvent, reporting_node: str, now: dt.datetime) -> dict[str, Any]:
    namespace = event.namespace or "default"
    involved: dict[str, Any] = {"apiVersion": "v1", "kind": event.object_kind, "name": event.name}
    if event.object_kind != "Node":
        involved["namespace"] = namespace
    if event.uid:
        involved["uid"] = event.uid
    stamp = rfc3339(now)
    return {
        "metadata": {"generateName": f"{event.name}.", "namespace": namespace},
        "involvedObject": involved,
        "reason": event.reason,
        "message": event.message[:1024],
        "type": "Warning" if event.warning else "Normal",
        "source": {"component": AGENT_COMPONENT, "host": reporting_node},
        "reportingComponent": AGENT_COMPONENT,
        "reportingInstance": reporting_node,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def _scheduled_at(conditions: object) -> dt.datetime | None:
    if not isinstance(conditions, list):
        return None
    for condition in conditions:
        if (
            isinstance(condition, Mapping)
            and condition.get("type") == "PodScheduled"
            and condition.get("status") == "True"
        ):
            return _timestamp(condition.get("lastTransitionTime"))
    return None


def _timestamp(value: object) -> dt.datetime | None:
    if isinstance(value, dt.datetime):
        return value
    if isinstance(value, str) and value:
        try:
            return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    return None
