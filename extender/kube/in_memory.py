"""An in-memory cluster that speaks the extender's `ClusterApi`, for the demo and fast tests.

It keeps real semantics where they matter to correctness: resourceVersion preconditions on
ledgers (409 on a stale write), uid/resourceVersion preconditions and "already assigned" on
Bindings, annotations merged by the Binding, and change notifications to the watch handlers.
"""

from __future__ import annotations

import copy
import itertools
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from contract.gpu_topology import PublishedTopology
from contract.ledger import Ledger
from extender.config import ExtenderConfig
from extender.kube.translate import pod_is_tracked, read_scheduling_policy, tracked_pod
from extender.state.cluster_api import ApiConflict, ApiError, ApiNotFound, Identity, PodObject, WatchHandlers
from extender.state.snapshot import NodeFacts, TrackedPod


@dataclass(frozen=True, slots=True)
class EmittedEvent:
    namespace: str
    pod: str
    reason: str
    message: str
    warning: bool


class InMemoryCluster:
    def __init__(self, config: ExtenderConfig) -> None:
        self._config = config
        self._lock = threading.RLock()
        self._rv = itertools.count(1)
        self._pods: dict[tuple[str, str], dict[str, Any]] = {}
        self._ledgers: dict[str, Ledger] = {}
        self._nodes: dict[str, NodeFacts] = {}
        self._topologies: dict[str, PublishedTopology] = {}
        self._handlers: list[WatchHandlers] = []
        self._pods_revision = 0  # bumped with every pod change, told to the watchers first
        self.events: list[EmittedEvent] = []
        self.nudged: list[tuple[str, str, str]] = []  # (namespace, name, value) of nudge_pod calls
        self.fail_next_bind: str = ""
        # bearer token -> (identity, the debug subresources it may use), for debug access tests
        self.tokens: dict[str, tuple[Identity, frozenset[str]]] = {}
        self._policies: dict[str, dict[str, Any]] = {}  # GpuSchedulingPolicy objects by name
        self._namespaces: dict[str, str | None] = {}  # namespace -> the default policy it names

    # ------------------------------------------------------------------ cluster-side edits

    def add_node(self, facts: NodeFacts, published: PublishedTopology | None) -> None:
        with self._lock:
            self._nodes[facts.name] = facts
            if published is not None:
                self._topologies[facts.name] = published
            for h in self._handlers:
                h.node(facts)
                h.topology(facts.name, published, "")

    def set_topology(self, node: str, published: PublishedTopology | None) -> None:
        with self._lock:
            if published is None:
                self._topologies.pop(node, None)
            else:
                self._topologies[node] = published
            for h in self._handlers:
                h.topology(node, published, "")

    def put_policy(self, obj: Mapping[str, Any]) -> None:
        """Create or replace a GpuSchedulingPolicy object (as JSON)."""
        with self._lock:
            name = str(obj["metadata"]["name"])
            self._policies[name] = copy.deepcopy(dict(obj))
            for h in self._handlers:
                h.policy(*read_scheduling_policy(obj))

    def delete_policy(self, name: str) -> None:
        with self._lock:
            self._policies.pop(name, None)
            for h in self._handlers:
                h.policy_deleted(name)

    def set_namespace_policy(self, namespace: str, policy: str | None) -> None:
        """The namespace's label linkpack.io/policy (None: no label)."""
        with self._lock:
            self._namespaces[namespace] = policy
            for h in self._handlers:
                h.namespace(namespace, policy)

    def create_pod(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        with self._lock:
            pod = copy.deepcopy(dict(manifest))
            meta = pod.setdefault("metadata", {})
            meta.setdefault("namespace", "default")
            meta.setdefault("uid", f"uid-{meta['namespace']}-{meta['name']}-{next(self._rv)}")
            meta["resourceVersion"] = str(next(self._rv))
            key = (meta["namespace"], meta["name"])
            if key in self._pods:
                raise ApiConflict(f"pod {key[0]}/{key[1]} already exists")
            self._pods[key] = pod
            self._notify_pod(pod)
            return copy.deepcopy(pod)

    def delete_pod(self, namespace: str, name: str) -> None:
        with self._lock:
            pod = self._pods.pop((namespace, name), None)
            if pod is None:
                raise ApiNotFound(f"pod {namespace}/{name} not found")
            revision = self._next_revision()
            for h in self._handlers:
                h.pods_revision(revision)
                h.pod_deleted(pod["metadata"]["uid"])

    def pods(self) -> list[dict[str, Any]]:
        with self._lock:
            return [copy.deepcopy(p) for _, p in sorted(self._pods.items())]

    # ------------------------------------------------------------------ ClusterApi

    def read_pod(self, namespace: str, name: str) -> PodObject:
        with self._lock:
            pod = self._pods.get((namespace, name))
            if pod is None:
                raise ApiNotFound(f"pod {namespace}/{name} not found")
            return PodObject(
                tracked_pod(pod, self._config), pod["metadata"]["resourceVersion"], copy.deepcopy(pod)
            )

    def read_ledger(self, node: str) -> Ledger:
        with self._lock:
            return self._ledgers.get(node, Ledger(node))

    def write_ledger(self, ledger: Ledger) -> Ledger:
        with self._lock:
            current = self._ledgers.get(ledger.node)
            current_rv = current.resource_version if current else ""
            if ledger.resource_version != current_rv:
                raise ApiConflict(
                    f"ledger of {ledger.node} is at {current_rv or 'absent'}, write was based on "
                    f"{ledger.resource_version or 'absent'}"
                )
            stored = Ledger(ledger.node, ledger.entries, str(next(self._rv)))
            self._ledgers[ledger.node] = stored
            for h in self._handlers:
                h.ledger(stored)
            return stored

    def bind(
        self,
        namespace: str,
        name: str,
        uid: str,
        resource_version: str,
        node: str,
        annotations: Mapping[str, str],
    ) -> None:
        with self._lock:
            if self.fail_next_bind:
                reason, self.fail_next_bind = self.fail_next_bind, ""
                raise ApiError(reason)
            pod = self._pods.get((namespace, name))
            if pod is None:
                raise ApiNotFound(f"pod {namespace}/{name} not found")
            meta = pod["metadata"]
            if uid and meta["uid"] != uid:
                raise ApiConflict(
                    f"Precondition failed: UID in precondition: {uid}, UID in object meta: {meta['uid']}"
                )
            if resource_version and meta["resourceVersion"] != resource_version:
                raise ApiConflict(f"pod {namespace}/{name} changed since it was read")
            spec = pod.setdefault("spec", {})
            if spec.get("nodeName"):
                raise ApiConflict(f"pod {name} is already assigned to node {spec['nodeName']!r}")
            spec["nodeName"] = node
            meta.setdefault("annotations", {}).update(annotations)
            meta["resourceVersion"] = str(next(self._rv))
            self._notify_pod(pod)

    def emit_event(
        self, namespace: str, pod: str, uid: str, reason: str, message: str, warning: bool
    ) -> None:
        with self._lock:
            self.events.append(EmittedEvent(namespace, pod, reason, message, warning))

    def nudge_pod(self, namespace: str, name: str, uid: str, value: str) -> None:
        with self._lock:
            self.nudged.append((namespace, name, value))

    def review_token(self, token: str) -> Identity | None:
        with self._lock:
            known = self.tokens.get(token)
            return known[0] if known else None

    def review_access(
        self, identity: Identity, verb: str, group: str, resource: str, subresource: str
    ) -> tuple[bool, str]:
        with self._lock:
            for known, allowed in self.tokens.values():
                if known == identity:
                    return subresource in allowed, "" if subresource in allowed else "no RBAC rule"
            return False, "unknown identity"

    def run_watches(self, handlers: WatchHandlers, stop: Callable[[], bool]) -> None:
        """Feeds the current contents, then every later change as it happens; returns at once."""
        with self._lock:
            self._handlers.append(handlers)
            for facts in self._nodes.values():
                handlers.node(facts)
            for name, record in self._topologies.items():
                handlers.topology(name, record, "")
            for ledger in self._ledgers.values():
                handlers.ledger(ledger)
            for pod in self._pods.values():
                if pod_is_tracked(pod, self._config):
                    handlers.pod(tracked_pod(pod, self._config))
            for obj in self._policies.values():
                handlers.policy(*read_scheduling_policy(obj))
            for namespace, default in self._namespaces.items():
                handlers.namespace(namespace, default)
            for kind in ("nodes", "topologies", "ledgers", "pods", "policies", "namespaces"):
                handlers.synced(kind)

    def _notify_pod(self, pod: Mapping[str, Any]) -> None:
        if not pod_is_tracked(pod, self._config):
            return
        view: TrackedPod = tracked_pod(pod, self._config)
        revision = self._next_revision()
        for h in self._handlers:
            h.pods_revision(revision)
            h.pod(view)

    def _next_revision(self) -> str:
        """The revision of the next pod change (as etcd's, a growing number)."""
        self._pods_revision += 1
        return str(self._pods_revision)

    @property
    def pods_revision(self) -> str:
        return str(self._pods_revision)
