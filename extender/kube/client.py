"""The real Kubernetes adapter of the extender (with `extender.kube.watch` and
`extender.kube.api_requests`, the only extender modules importing `kubernetes`).

It lists and watches Nodes, Pods, GpuTopology objects and ledger ConfigMaps, reads pods
fresh for bind, commits ledgers with resourceVersion preconditions and creates Bindings.
Client exceptions are translated into `ApiError` kinds and never leave this module.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from contract.keys import (
    CAPACITY_FREED_ANNOTATION,
    EXTENDER_COMPONENT,
    GROUP,
    LEDGER_LABEL,
    TOPOLOGY_PLURAL,
    TOPOLOGY_VERSION,
    ledger_name,
    ledger_node,
)
from contract.ledger import Ledger, encode_ledger, ledger_from_config_map
from contract.scheduling_policy import POLICY_PLURAL, POLICY_VERSION
from extender.config import ExtenderConfig
from extender.kube.api_requests import ApiReply, ApiRequests, path
from extender.kube.translate import (
    namespace_default_policy,
    node_facts,
    pod_is_tracked,
    read_gpu_topology,
    read_scheduling_policy,
    tracked_pod,
)
from extender.kube.watch import ListWatch, Sink
from extender.state.cluster_api import ApiConflict, ApiError, ApiNotFound, Identity, PodObject, WatchHandlers

log = logging.getLogger(__name__)


def load_client(kubeconfig: str | None) -> client.ApiClient:
    """An API client from a kubeconfig file, or the in-cluster service account when None."""
    try:
        if kubeconfig:
            cfg = client.Configuration()
            load_file: Any = config.load_kube_config
            load_file(config_file=kubeconfig, client_configuration=cfg)
        else:
            load_incluster: Any = config.load_incluster_config
            load_incluster()
            cfg = client.Configuration.get_default_copy()
    except (config.ConfigException, OSError) as exc:
        raise ApiError(f"cannot load Kubernetes credentials: {exc}") from exc
    cfg.client_side_validation = False
    return client.ApiClient(cfg)


def _check(reply: ApiReply, what: str) -> None:
    """Nothing for a 2xx reply, else the matching ApiError kind with the API server's message."""
    if reply.ok:
        return
    reason = reply.message()
    if reply.status == 409:
        raise ApiConflict(f"{what}: {reason}")
    if reply.status == 404:
        raise ApiNotFound(f"{what}: {reason}")
    raise ApiError(f"{what}: HTTP {reply.status} {reason}")


def _translate(exc: Exception, what: str) -> ApiError:
    if isinstance(exc, ApiException):
        reason = _status_message(exc)
        if exc.status == 409:
            return ApiConflict(f"{what}: {reason}")
        if exc.status == 404:
            return ApiNotFound(f"{what}: {reason}")
        return ApiError(f"{what}: HTTP {exc.status} {reason}")
    return ApiError(f"{what}: {exc}")


def _status_message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except (ValueError, AttributeError):
        return str(exc.reason)


_FAILURES = (ApiException, HTTPError, OSError, ValueError)
_WRITTEN_LIMIT = 100_000


class KubeClusterApi:
    def __init__(
        self, api_client: client.ApiClient, cfg: ExtenderConfig, *, requests: ApiRequests | None = None
    ) -> None:
        self.api_client = api_client
        self._client = api_client
        # The generated client's annotations describe its model classes; we pass and read raw
        # JSON (see bind), so the API objects are used untyped.
        self._core: Any = client.CoreV1Api(api_client)
        self._custom: Any = client.CustomObjectsApi(api_client)
        self._authn: Any = client.AuthenticationV1Api(api_client)
        self._authz: Any = client.AuthorizationV1Api(api_client)
        self._config = cfg
        # the request path (bind's writes, pod and ledger reads, events): own pool, plain JSON;
        # `requests` replaces it (tests give scripted replies)
        self._requests = requests if requests is not None else ApiRequests(api_client)
        # ledger ConfigMap name -> the resourceVersion our last commit of it produced
        self._written: dict[str, str] = {}

    def close(self) -> None:
        """Close the client's connections (open watches end with an error their loops stop on)."""
        closing: Any = self._client.close  # untyped in the client
        closing()
        self._requests.close()

    # ------------------------------------------------------------------ reads and writes

    def read_pod(self, namespace: str, name: str) -> PodObject:
        what = f"read pod {namespace}/{name}"
        pod = self._json(
            self._call(what, "GET", path("api", "v1", "namespaces", namespace, "pods", name)), what
        )
        return PodObject(
            tracked_pod(pod, self._config), str(pod["metadata"].get("resourceVersion") or ""), pod
        )

    def read_ledger(self, node: str) -> Ledger:
        what = f"read ledger of {node}"
        reply = self._call(what, "GET", self._config_map_path(ledger_name(node)))
        if reply.status == 404:
            return Ledger(node)
        return self._ledger(reply, what)

    def write_ledger(self, ledger: Ledger) -> Ledger:
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": ledger_name(ledger.node),
                "namespace": self._config.namespace,
                "labels": {LEDGER_LABEL: "true"},
            },
            "data": encode_ledger(ledger),
        }
        what = f"commit ledger of {ledger.node}"
        if ledger.resource_version:
            # the compare-and-swap: the API server refuses (409) unless the stored version is this one
            body["metadata"]["resourceVersion"] = ledger.resource_version
            reply = self._call(what, "PUT", self._config_map_path(ledger_name(ledger.node)), body)
            if reply.status == 404:
                raise ApiConflict(f"{what}: ledger was deleted")
        else:
            reply = self._call(what, "POST", self._config_map_path(), body)
        committed = self._committed(reply, what, ledger, body["data"])
        if len(self._written) >= _WRITTEN_LIMIT:
            self._written.clear()
        self._written[ledger_name(committed.node)] = committed.resource_version
        return committed

    def bind(
        self,
        namespace: str,
        name: str,
        uid: str,
        resource_version: str,
        node: str,
        annotations: Mapping[str, str],
    ) -> None:
        metadata: dict[str, Any] = {"name": name, "namespace": namespace}
        if uid:
            metadata["uid"] = uid  # the API server refuses the Binding if the pod was re-created
        if resource_version:
            metadata["resourceVersion"] = resource_version
        if annotations:
            metadata["annotations"] = dict(annotations)
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": metadata,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        what = f"bind {namespace}/{name} to {node}"
        reply = self._call(
            what, "POST", path("api", "v1", "namespaces", namespace, "pods", name, "binding"), body
        )
        _check(reply, what)

    def nudge_pod(self, namespace: str, name: str, uid: str, value: str) -> None:
        body = {"metadata": {"uid": uid, "annotations": {CAPACITY_FREED_ANNOTATION: value}}}
        try:
            self._core.patch_namespaced_pod(name, namespace, body, _preload_content=False)
        except _FAILURES as exc:
            log.info("could not nudge pod %s/%s: %s", namespace, name, exc)

    def emit_event(
        self, namespace: str, pod: str, uid: str, reason: str, message: str, warning: bool
    ) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{pod}.", "namespace": namespace},
            "involvedObject": {
                "kind": "Pod",
                "namespace": namespace,
                "name": pod,
                "uid": uid,
                "apiVersion": "v1",
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": EXTENDER_COMPONENT},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        what = f"record event on {namespace}/{pod}"
        try:
            _check(self._call(what, "POST", path("api", "v1", "namespaces", namespace, "events"), body), what)
        except ApiError as exc:
            log.warning("could not record event on %s/%s: %s", namespace, pod, exc)

    def _config_map_path(self, name: str = "") -> str:
        parts = ("api", "v1", "namespaces", self._config.namespace, "configmaps")
        return path(*parts, name) if name else path(*parts)

    def _call(self, what: str, method: str, api_path: str, body: object = None) -> ApiReply:
        try:
            return self._requests.call(method, api_path, body)
        except (HTTPError, OSError, ValueError) as exc:
            raise ApiError(f"{what}: {exc}") from exc

    def _json(self, reply: ApiReply, what: str) -> Any:
        _check(reply, what)
        try:
            return reply.json()
        except ValueError as exc:
            raise ApiError(f"{what}: the API server's reply is not JSON: {exc}") from exc

    def _committed(self, reply: ApiReply, what: str, sent: Ledger, data: Mapping[str, str]) -> Ledger:
        """The ledger the API server stored. It stores a ConfigMap's data as sent, and then that is
        `sent` at the new resourceVersion, without decoding every entry again; anything else (an
        admission webhook changed it, a reply of another shape) is decoded from the reply."""
        doc = self._json(reply, what)
        meta = doc.get("metadata") if isinstance(doc, dict) else None
        if isinstance(meta, dict) and doc.get("data") == data and meta.get("name") == ledger_name(sent.node):
            version = meta.get("resourceVersion")
            if isinstance(version, str) and version:
                return Ledger(sent.node, sent.entries, version)
        return _decoded_ledger(doc, what)

    def _ledger(self, reply: ApiReply, what: str) -> Ledger:
        return _decoded_ledger(self._json(reply, what), what)

    # ------------------------------------------------------------------ reviews (debug access)

    def review_token(self, token: str) -> Identity | None:
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        try:
            raw = self._authn.create_token_review(body, _preload_content=False)
            status = json.loads(raw.data).get("status") or {}
        except _FAILURES as exc:
            raise _translate(exc, "review a debug caller's token") from exc
        if not status.get("authenticated"):
            return None
        user = status.get("user") or {}
        extra = user.get("extra") or {}
        return Identity(
            username=str(user.get("username") or ""),
            uid=str(user.get("uid") or ""),
            groups=tuple(str(g) for g in user.get("groups") or ()),
            extra=tuple(sorted((str(k), tuple(str(v) for v in vs or ())) for k, vs in extra.items())),
        )

    def review_access(
        self, identity: Identity, verb: str, group: str, resource: str, subresource: str
    ) -> tuple[bool, str]:
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": identity.username,
                "uid": identity.uid,
                "groups": list(identity.groups),
                "extra": {k: list(v) for k, v in identity.extra},
                "resourceAttributes": {
                    "group": group,
                    "resource": resource,
                    "subresource": subresource,
                    "verb": verb,
                },
            },
        }
        try:
            raw = self._authz.create_subject_access_review(body, _preload_content=False)
            status = json.loads(raw.data).get("status") or {}
        except _FAILURES as exc:
            raise _translate(exc, f"review {identity.username}'s access to {resource}/{subresource}") from exc
        return bool(status.get("allowed")), str(status.get("reason") or "")

    # ------------------------------------------------------------------ watches

    def run_watches(self, handlers: WatchHandlers, stop: Callable[[], bool]) -> None:
        loops = [
            ListWatch("nodes", self._core.list_node, self._on_node(handlers), stop, self._config),
            ListWatch(
                "topologies",
                lambda **kw: self._custom.list_cluster_custom_object(
                    GROUP, TOPOLOGY_VERSION, TOPOLOGY_PLURAL, **kw
                ),
                self._on_topology(handlers),
                stop,
                self._config,
            ),
            ListWatch(
                "ledgers",
                lambda **kw: self._core.list_namespaced_config_map(
                    self._config.namespace, label_selector=f"{LEDGER_LABEL}=true", **kw
                ),
                self._on_ledger(handlers),
                stop,
                self._config,
            ),
            ListWatch(
                "pods", self._core.list_pod_for_all_namespaces, self._on_pod(handlers), stop, self._config
            ),
            ListWatch(
                "policies",
                lambda **kw: self._custom.list_cluster_custom_object(
                    GROUP, POLICY_VERSION, POLICY_PLURAL, **kw
                ),
                self._on_policy(handlers),
                stop,
                self._config,
            ),
            ListWatch(
                "namespaces", self._core.list_namespace, self._on_namespace(handlers), stop, self._config
            ),
        ]
        threads = [threading.Thread(target=lp.run, name=f"watch-{lp.kind}", daemon=True) for lp in loops]
        for t in threads:
            t.start()
        for lp, t in zip(loops, threads, strict=True):
            t.join()
            del lp

    def _on_policy(self, h: WatchHandlers) -> Sink:
        def sink(event: str, obj: Mapping[str, Any]) -> None:
            name = str(obj["metadata"]["name"])
            if event == "DELETED":
                h.policy_deleted(name)
                return
            _, policy, problem = read_scheduling_policy(obj)
            if problem:
                log.error("GpuSchedulingPolicy %s cannot be used: %s", name, problem)
            h.policy(name, policy, problem)

        return Sink("policies", sink, h.synced, lambda o: str(o["metadata"]["name"]), h.policy_deleted)

    def _on_namespace(self, h: WatchHandlers) -> Sink:
        def sink(event: str, obj: Mapping[str, Any]) -> None:
            name, default_policy = namespace_default_policy(obj)
            if event == "DELETED":
                h.namespace_deleted(name)
            else:
                h.namespace(name, default_policy)

        return Sink("namespaces", sink, h.synced, lambda o: str(o["metadata"]["name"]), h.namespace_deleted)

    def _on_node(self, h: WatchHandlers) -> Sink:
        def sink(event: str, obj: Mapping[str, Any]) -> None:
            if event == "DELETED":
                h.node_deleted(str(obj["metadata"]["name"]))
            else:
                h.node(node_facts(obj, self._config.resources))

        return Sink("nodes", sink, h.synced, lambda o: str(o["metadata"]["name"]), h.node_deleted)

    def _on_topology(self, h: WatchHandlers) -> Sink:
        def sink(event: str, obj: Mapping[str, Any]) -> None:
            name = str(obj["metadata"]["name"])
            if event == "DELETED":
                h.topology(name, None, "")
                return
            node, published, problem = read_gpu_topology(obj)
            if problem:
                log.error("node %s treated as without topology: %s", name, problem)
            h.topology(node or name, published, problem)

        return Sink(
            "topologies",
            sink,
            h.synced,
            lambda o: str(o["metadata"]["name"]),
            lambda n: h.topology(n, None, ""),
        )

    def ledger_sink(self, handlers: WatchHandlers) -> Sink:
        """What the ledgers watch feeds its events to (`run_watches`): ledgers to `handlers`, except
        the echo of a commit of our own."""
        return self._on_ledger(handlers)

    def _on_ledger(self, h: WatchHandlers) -> Sink:
        def sink(event: str, obj: Mapping[str, Any]) -> None:
            meta = obj.get("metadata") or {}
            name, rv = str(meta.get("name") or ""), str(meta.get("resourceVersion") or "")
            if event != "DELETED" and rv and self._written.get(name) == rv:
                return  # the echo of our own commit: the binder has already applied this very version
            try:
                ledger = ledger_from_config_map(obj)
            except ValueError as exc:
                log.error("ledger %s is malformed and ignored: %s", obj["metadata"].get("name"), exc)
                return
            if event == "DELETED":
                h.ledger_deleted(ledger.node)
            else:
                h.ledger(ledger)

        def node_of(o: Mapping[str, Any]) -> str:
            return ledger_node(str(o["metadata"]["name"]))

        return Sink("ledgers", sink, h.synced, node_of, h.ledger_deleted)

    def _on_pod(self, h: WatchHandlers) -> Sink:
        cfg = self._config

        def sink(event: str, obj: Mapping[str, Any]) -> None:
            if event == "DELETED":
                h.pod_deleted(str(obj["metadata"].get("uid") or ""))
            elif pod_is_tracked(obj, cfg):
                h.pod(tracked_pod(obj, cfg))

        return Sink(
            "pods",
            sink,
            h.synced,
            lambda o: str(o["metadata"].get("uid") or ""),
            h.pod_deleted,
            h.pods_revision,
        )


def _decoded_ledger(doc: Any, what: str) -> Ledger:
    """A ledger from the API server's ConfigMap JSON; ApiError naming the call when malformed."""
    try:
        return ledger_from_config_map(doc)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ApiError(f"{what}: {exc}") from exc
