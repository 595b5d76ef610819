"""`NodeApi` over the official Kubernetes client: the only node_agent module importing `kubernetes`.

Build with `KubernetesNodeApi.from_config`. The GpuTopology object is written through the
contract's encoders (`topology_object`, `encode_status`) and read with its decoder; pods are
translated by `kube.pod_from_dict`, reading only the resources of `ResourceNames` they ask for.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from kubernetes import client, config

from contract.gpu_topology import (
    GpuTopologyError,
    PublishedTopology,
    TopologyStatus,
    decode_gpu_topology,
    encode_status,
    topology_object,
)
from contract.keys import GROUP, TOPOLOGY_KIND, TOPOLOGY_PLURAL, TOPOLOGY_VERSION
from contract.resources import ResourceNames
from node_agent.kube.node_api import (
    AgentEvent,
    KubeConflict,
    KubeError,
    KubeNotFound,
    NodeMetadata,
    PodInfo,
    event_body,
    node_metadata_from_dict,
    node_metadata_patch,
    pod_from_dict,
)
from topology.model import NodeTopology

MERGE_PATCH = "application/merge-patch+json"
SPEC_WRITE_ATTEMPTS = 3


class KubernetesNodeApi:
    """`NodeApi` over the official client."""

    def __init__(
        self,
        api_client: Any,
        reporting_node: str,
        resources: ResourceNames | None = None,
        *,
        core: Any = None,
        custom: Any = None,
    ) -> None:
        """`core` and `custom` replace the client's CoreV1Api and CustomObjectsApi (tests record
        the calls); by default they are the client's own over `api_client`."""
        self._api_client = api_client
        self._core = core if core is not None else client.CoreV1Api(api_client)
        self._custom = custom if custom is not None else client.CustomObjectsApi(api_client)
        self._node = reporting_node
        self._wanted = (resources or ResourceNames()).managed

    @classmethod
    def from_config(
        cls, reporting_node: str, kubeconfig: str | None = None, resources: ResourceNames | None = None
    ) -> KubernetesNodeApi:
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
        return cls(api_client, reporting_node, resources)

    def get_node_annotations(self, node: str) -> Mapping[str, str]:
        obj = self._plain(self._guard(f"get node {node}", self._core.read_node, node))
        return MappingProxyType(dict((obj.get("metadata") or {}).get("annotations") or {}))

    def patch_node_annotations(self, node: str, changes: Mapping[str, str | None]) -> None:
        body = {"metadata": {"annotations": dict(changes)}}
        self._guard(f"patch node {node}", self._core.patch_node, node, body, _content_type=MERGE_PATCH)

    def get_node_metadata(self, node: str) -> NodeMetadata:
        return node_metadata_from_dict(
            self._plain(self._guard(f"get node {node}", self._core.read_node, node))
        )

    def patch_node_labels(
        self,
        node: str,
        labels: Mapping[str, str | None],
        annotations: Mapping[str, str | None],
        resource_version: str,
    ) -> None:
        body = node_metadata_patch(labels, annotations, resource_version)
        self._guard(f"patch node {node} labels", self._core.patch_node, node, body, _content_type=MERGE_PATCH)

    def get_topology(self, node: str) -> PublishedTopology | None:
        obj = self._topology_object(node)
        if obj is None:
            return None
        try:
            return decode_gpu_topology(obj)
        except GpuTopologyError as exc:
            raise KubeError(f"get {TOPOLOGY_KIND} {node}: {exc}") from exc

    def put_topology_spec(self, node: str, topology: NodeTopology) -> None:
        for _attempt in range(SPEC_WRITE_ATTEMPTS):
            current = self._topology_object(node)  # raw: a malformed object is replaced all the same
            try:
                if current is None:
                    self._guard(
                        f"create {TOPOLOGY_KIND} {node}",
                        self._custom.create_cluster_custom_object,
                        GROUP,
                        TOPOLOGY_VERSION,
                        TOPOLOGY_PLURAL,
                        topology_object(node, topology),
                    )
                else:
                    version = str((current.get("metadata") or {}).get("resourceVersion") or "")
                    self._guard(
                        f"replace {TOPOLOGY_KIND} {node}",
                        self._custom.replace_cluster_custom_object,
                        GROUP,
                        TOPOLOGY_VERSION,
                        TOPOLOGY_PLURAL,
                        node,
                        topology_object(node, topology, version),
                    )
                return
            except KubeConflict:
                continue  # someone wrote in between (or created it first): read again
        raise KubeConflict(
            f"{TOPOLOGY_KIND} {node}: kept conflicting after {SPEC_WRITE_ATTEMPTS} attempts", 409
        )

    def patch_topology_status(self, node: str, status: TopologyStatus) -> None:
        self._guard(
            f"patch {TOPOLOGY_KIND} {node} status",
            self._custom.patch_cluster_custom_object_status,
            GROUP,
            TOPOLOGY_VERSION,
            TOPOLOGY_PLURAL,
            node,
            {"status": encode_status(status)},
            _content_type=MERGE_PATCH,
        )

    def list_node_pods(self, node: str) -> tuple[PodInfo, ...]:
        return self.list_node_pods_with_revision(node)[0]

    def list_node_pods_with_revision(self, node: str) -> tuple[tuple[PodInfo, ...], str]:
        """The node's pods and the resourceVersion of the list (`contract.handoff`)."""
        listed = self._guard(
            f"list pods on {node}",
            self._core.list_pod_for_all_namespaces,
            field_selector=f"spec.nodeName={node}",
        )
        plain = self._plain(listed)
        items = plain.get("items") or []
        revision = str((plain.get("metadata") or {}).get("resourceVersion") or "")
        return tuple(pod_from_dict(item, self._wanted) for item in items), revision

    def get_pod(self, namespace: str, name: str) -> PodInfo | None:
        try:
            obj = self._guard(f"get pod {namespace}/{name}", self._core.read_namespaced_pod, name, namespace)
        except KubeNotFound:
            return None
        return pod_from_dict(self._plain(obj), self._wanted)

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
        return pod_from_dict(self._plain(patched), self._wanted)

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

    def _topology_object(self, node: str) -> dict[str, Any] | None:
        try:
            obj = self._guard(
                f"get {TOPOLOGY_KIND} {node}",
                self._custom.get_cluster_custom_object,
                GROUP,
                TOPOLOGY_VERSION,
                TOPOLOGY_PLURAL,
                node,
            )
        except KubeNotFound:
            return None
        return self._plain(obj)

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
