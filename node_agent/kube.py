"""The agent's view of the Kubernetes API (the only node_agent module importing `kubernetes`).

`ClusterApi` is what the agent needs; `KubernetesClusterApi` implements it over the official
client. Objects cross the seam as plain JSON-shaped dicts translated by the pure functions
below into our frozen types, and every `ApiException` becomes `KubeError`
(`KubeConflict` for 409, `KubeNotFound` for 404).

The `GpuTopology` record (linkpack.io/v1alpha1, plural gputopologies, cluster-scoped, named
after the node): spec = the topology codec dict, status = {heartbeat, gpuHealth, agentVersion},
written through the status subresource. The spec's content hash rides in the annotation
`linkpack.io/topology-hash` so a restarted agent can tell whether the spec is current.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from kubernetes import client, config

GROUP = "linkpack.io"
VERSION = "v1alpha1"
PLURAL = "gputopologies"
KIND = "GpuTopology"
HASH_ANNOTATION = "linkpack.io/topology-hash"
COMPONENT = "linkpack-node-agent"
MERGE_PATCH = "application/merge-patch+json"


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
class ContainerRequests:
    """Extended-resource requests of one container (names with a domain, e.g. linkpack.io/gpu).

    `restart_policy` is the container's own restartPolicy ("" when unset); an init container
    with "Always" is a sidecar that runs for the pod's life.
    """

    name: str
    resources: tuple[tuple[str, int], ...]
    restart_policy: str = ""

    @property
    def sidecar(self) -> bool:
        return self.restart_policy == "Always"


@dataclass(frozen=True, slots=True)
class PodInfo:
    namespace: str
    name: str
    uid: str
    resource_version: str = ""
    node_name: str = ""
    phase: str = ""
    annotations: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    containers: tuple[ContainerRequests, ...] = ()
    created: dt.datetime | None = None
    init_containers: tuple[ContainerRequests, ...] = ()  # spec order
    scheduled_at: dt.datetime | None = None  # the PodScheduled=True condition's transition time

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def bound_at(self) -> dt.datetime | None:
        """When the pod was bound to its node, as well as the API tells: scheduled, else created."""
        return self.scheduled_at or self.created

    def requested(self, resource: str) -> int:
        """Total of one extended resource over all app containers."""
        return sum(n for c in self.containers for name, n in c.resources if name == resource)


@dataclass(frozen=True)
class TopologyRecord:
    name: str
    spec: Mapping[str, Any]
    status: Mapping[str, Any]
    content_hash: str
    resource_version: str


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


class ClusterApi(Protocol):
    def get_node_annotations(self, node: str) -> Mapping[str, str]: ...

    def patch_node_annotations(self, node: str, changes: Mapping[str, str | None]) -> None:
        """Set (value) or remove (None) annotations on the node."""
        ...

    def get_topology(self, node: str) -> TopologyRecord | None: ...

    def put_topology_spec(self, node: str, spec: Mapping[str, Any], content_hash: str) -> None:
        """Create the node's GpuTopology, or replace its spec if it exists."""
        ...

    def patch_topology_status(self, node: str, status: Mapping[str, Any]) -> None: ...

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


def pod_from_dict(obj: Mapping[str, Any]) -> PodInfo:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    return PodInfo(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
        node_name=str(spec.get("nodeName") or ""),
        phase=str(status.get("phase") or ""),
        annotations=MappingProxyType({str(k): str(v) for k, v in (meta.get("annotations") or {}).items()}),
        containers=_container_requests(spec.get("containers")),
        created=_timestamp(meta.get("creationTimestamp")),
        init_containers=_container_requests(spec.get("initContainers")),
        scheduled_at=_scheduled_at(status.get("conditions")),
    )


def _container_requests(containers: object) -> tuple[ContainerRequests, ...]:
    if not isinstance(containers, list):
        return ()
    return tuple(
        ContainerRequests(
            str(c.get("name") or ""),
            extended_requests(c.get("resources") or {}),
            str(c.get("restartPolicy") or ""),
        )
        for c in containers
        if isinstance(c, Mapping)
    )


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


def extended_requests(resources: Mapping[str, Any]) -> tuple[tuple[str, int], ...]:
    """Requests (falling back to limits) of domain-qualified resources, as whole numbers."""
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    found = []
    for name, quantity in merged.items():
        if "/" not in name or name.startswith("kubernetes.io/"):
            continue
        amount = _whole_quantity(str(quantity))
        if amount is not None:
            found.append((str(name), amount))
    return tuple(sorted(found))


def topology_object(
    node: str, spec: Mapping[str, Any], content_hash: str, resource_version: str = ""
) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": node,
        "labels": {"app.kubernetes.io/managed-by": COMPONENT},
        "annotations": {HASH_ANNOTATION: content_hash},
    }
    if resource_version:
        metadata["resourceVersion"] = resource_version
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": metadata, "spec": dict(spec)}


def topology_record_from_dict(obj: Mapping[str, Any]) -> TopologyRecord:
    meta = obj.get("metadata") or {}
    return TopologyRecord(
        name=str(meta.get("name") or ""),
        spec=MappingProxyType(dict(obj.get("spec") or {})),
        status=MappingProxyType(dict(obj.get("status") or {})),
        content_hash=str((meta.get("annotations") or {}).get(HASH_ANNOTATION) or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
    )


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
        "source": {"component": COMPONENT, "host": reporting_node},
        "reportingComponent": COMPONENT,
        "reportingInstance": reporting_node,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def _timestamp(value: object) -> dt.datetime | None:
    if isinstance(value, dt.datetime):
        return value
    if isinstance(value, str) and value:
        try:
            return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    return None


_SUFFIX = {
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


def _whole_quantity(text: str) -> int | None:
    text = text.strip()
    for suffix in sorted(_SUFFIX, key=len, reverse=True):
        if text.endswith(suffix) and text[: -len(suffix)].isdigit():
            return int(text[: -len(suffix)]) * _SUFFIX[suffix]
    return int(text) if text.isdigit() else None


# ----------------------------------------------------------------------------- the adapter


class KubernetesClusterApi:
    """`ClusterApi` over the official client. Build with `from_config`."""

    def __init__(self, api_client: Any, reporting_node: str) -> None:
        self._api_client = api_client
        self._core = client.CoreV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)
        self._node = reporting_node

    @classmethod
    def from_config(cls, reporting_node: str, kubeconfig: str | None = None) -> KubernetesClusterApi:
        """In-cluster service account when `kubeconfig` is None, else that kubeconfig file."""
        try:
            if kubeconfig:
                api_client = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
            else:
                config.load_incluster_config()  # type: ignore[no-untyped-call]
                api_client = client.ApiClient()
        except Exception as exc:
            raise KubeError(
                f"cannot load Kubernetes credentials ({kubeconfig or 'in-cluster'}): {exc}"
            ) from exc
        return cls(api_client, reporting_node)

    def get_node_annotations(self, node: str) -> Mapping[str, str]:
        obj = self._plain(self._guard(f"get node {node}", self._core.read_node, node))
        return MappingProxyType(dict((obj.get("metadata") or {}).get("annotations") or {}))

    def patch_node_annotations(self, node: str, changes: Mapping[str, str | None]) -> None:
        body = {"metadata": {"annotations": dict(changes)}}
        self._guard(f"patch node {node}", self._core.patch_node, node, body, _content_type=MERGE_PATCH)

    def get_topology(self, node: str) -> TopologyRecord | None:
        try:
            obj = self._guard(
                f"get {KIND} {node}", self._custom.get_cluster_custom_object, GROUP, VERSION, PLURAL, node
            )
        except KubeNotFound:
            return None
        return topology_record_from_dict(self._plain(obj))

    def put_topology_spec(self, node: str, spec: Mapping[str, Any], content_hash: str) -> None:
        for _attempt in range(3):
            current = self.get_topology(node)
            try:
                if current is None:
                    self._guard(
                        f"create {KIND} {node}",
                        self._custom.create_cluster_custom_object,
                        GROUP,
                        VERSION,
                        PLURAL,
                        topology_object(node, spec, content_hash),
                    )
                else:
                    body = topology_object(node, spec, content_hash, current.resource_version)
                    self._guard(
                        f"replace {KIND} {node}",
                        self._custom.replace_cluster_custom_object,
                        GROUP,
                        VERSION,
                        PLURAL,
                        node,
                        body,
                    )
                return
            except KubeConflict:
                continue  # someone wrote in between (or created it first): read again
        raise KubeConflict(f"{KIND} {node}: kept conflicting after 3 attempts", 409)

    def patch_topology_status(self, node: str, status: Mapping[str, Any]) -> None:
        self._guard(
            f"patch {KIND} {node} status",
            self._custom.patch_cluster_custom_object_status,
            GROUP,
            VERSION,
            PLURAL,
            node,
            {"status": dict(status)},
            _content_type=MERGE_PATCH,
        )

    def list_node_pods(self, node: str) -> tuple[PodInfo, ...]:
        listed = self._guard(
            f"list pods on {node}",
            self._core.list_pod_for_all_namespaces,
            field_selector=f"spec.nodeName={node}",
        )
        items = self._plain(listed).get("items") or []
        return tuple(pod_from_dict(item) for item in items)

    def get_pod(self, namespace: str, name: str) -> PodInfo | None:
        try:
            obj = self._guard(f"get pod {namespace}/{name}", self._core.read_namespaced_pod, name, namespace)
        except KubeNotFound:
            return None
        return pod_from_dict(self._plain(obj))

    def patch_pod_annotations(
        self, namespace: str, name: str, changes: Mapping[str, str | None], resource_version: str
    ) -> PodInfo:
        body = {"metadata": {"resourceVersion": resource_version, "annotations": dict(changes)}}
        patched = self._guard(
            f"patch pod {namespace}/{name}",
            self._core.patch_namespaced_pod,
            name,
            namespace,
            body,
            _content_type=MERGE_PATCH,
        )
        return pod_from_dict(self._plain(patched))

    def emit_event(self, event: AgentEvent) -> None:
        body = event_body(event, self._node, dt.datetime.now(dt.UTC))
        model_cls = getattr(client, "CoreV1Event", None)
        payload = (
            model_cls.from_dict(body) if model_cls is not None and hasattr(model_cls, "from_dict") else body
        )
        self._guard(
            f"emit event {event.reason} on {event.object_kind} {event.name}",
            self._core.create_namespaced_event,
            body["metadata"]["namespace"],
            payload,
        )

    def _plain(self, obj: Any) -> dict[str, Any]:
        plain = self._api_client.sanitize_for_serialization(obj)
        return plain if isinstance(plain, dict) else {}

    def _guard(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise kube_error(what, exc) from exc


def kube_error(what: str, exc: BaseException) -> KubeError:
    """Our error for any failure of the client (ApiException, connection errors, bad data)."""
    status = getattr(exc, "status", None)
    status = status if isinstance(status, int) else None
    reason = getattr(exc, "reason", None) or str(exc) or type(exc).__name__
    message = f"{what}: HTTP {status} {reason}" if status is not None else f"{what}: {reason}"
    if status == 409:
        return KubeConflict(message, status)
    if status == 404:
        return KubeNotFound(message, status)
    return KubeError(message, status)
