"""Pods for tests, built in one place, in the shapes tests need them.

- `pod_manifest()`: a pod manifest as the API server holds it and kube-scheduler sends it to the
  extender (`metadata`, `spec`, `status`). By default a pending pod of the linkpack scheduler in
  namespace "ml" with one container, "main", asking for what `gpus`, `units`, `memory` and `mig`
  say (as limits and, as the API server defaults them for extended resources, the same requests).
- `api_pod_manifest()`: the body that creates such a pod through the API: `apiVersion` and
  `kind`, no namespace (the request's path names it) and no status.
- `container()`: one entry of `spec.containers` or `spec.initContainers`.
- `pod_info()`: the node agent's `PodInfo` of a pod, with its allocation record.
- `filter_args()`: the ExtenderArgs body kube-scheduler sends to filter and prioritize.

Resource names are the contract's (`tests.support.resources`).
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from contract.allocation import Allocation, encode_allocation
from contract.keys import ALLOCATION_ANNOTATION, POLICY_ANNOTATION
from contract.pod_demand import ContainerDemand
from node_agent.kube.node_api import PodInfo
from tests.support.resources import GPU, MEMORY, SHARED, mig_resource

#: An image no registry serves: nothing in a test ever pulls it.
IMAGE = "registry.invalid/app:1"
SCHEDULER = "linkpack"
NAMESPACE = "ml"

Amount = int | str  # a count, or a quantity as written ("1Ki", "500m")

_names = itertools.count()


def gpu_limits(
    gpus: Amount = 0, units: Amount = 0, memory: Amount = 0, mig: Mapping[str, Amount] | None = None
) -> dict[str, str]:
    """Whole GPUs, share units, share memory (MiB) and MIG instances by profile, as resource
    quantities; amounts of 0 are left out."""
    asked = {GPU: gpus, SHARED: units, MEMORY: memory}
    asked.update({mig_resource(profile): n for profile, n in (mig or {}).items()})
    return {name: str(n) for name, n in asked.items() if n not in (0, "")}


def container(
    name: str = "main",
    *,
    gpus: Amount = 0,
    units: Amount = 0,
    memory: Amount = 0,
    mig: Mapping[str, Amount] | None = None,
    limits: Mapping[str, str] | None = None,
    requests: Mapping[str, str] | None = None,
    limits_only: bool = False,
    image: str | None = IMAGE,
    restart_policy: str = "",
) -> dict[str, Any]:
    """A container asking for GPUs (`gpus`, `units`, `memory`, `mig`) plus any other `limits`
    and `requests` (CPU, memory, quantities as written). The GPU limits are repeated as requests,
    as the API server defaults them, unless `limits_only` (as a user writes a pod); `requests`
    are added either way. `restart_policy="Always"` makes an init container a sidecar."""
    asked = {**gpu_limits(gpus, units, memory, mig), **(limits or {})}
    resources: dict[str, Any] = {"limits": asked}
    if not limits_only:
        resources["requests"] = {**(requests or {}), **asked}
    elif requests:
        resources["requests"] = dict(requests)
    out: dict[str, Any] = {"name": name}
    if image:
        out["image"] = image
    out["resources"] = resources
    if restart_policy:
        out["restartPolicy"] = restart_policy
    return out


def pod_manifest(
    name: str | None = None,
    *,
    gpus: Amount = 0,
    units: Amount = 0,
    memory: Amount = 0,
    mig: Mapping[str, Amount] | None = None,
    limits: Mapping[str, str] | None = None,
    requests: Mapping[str, str] | None = None,
    limits_only: bool = False,
    image: str | None = IMAGE,
    containers: Sequence[dict[str, Any]] | None = None,
    init_containers: Sequence[dict[str, Any]] | None = None,
    namespace: str | None = NAMESPACE,
    uid: str | None = None,
    resource_version: str | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    policy: str | None = None,
    scheduler: str | None = SCHEDULER,
    node: str | None = None,
    node_selector: Mapping[str, str] | None = None,
    affinity: Mapping[str, Any] | None = None,
    service_account: str | None = None,
    overhead: Mapping[str, str] | None = None,
    phase: str | None = "Pending",
) -> dict[str, Any]:
    """A pod manifest (see the module's words). Without `containers`, one container "main" asks
    for the GPU amounts, `limits` and `requests` given (`container()`); `name` defaults to a new
    "pod-N". `policy` is the `linkpack.io/policy` annotation; `node` is `spec.nodeName` (a bound
    pod); `phase` None leaves out the status. The metadata always has an annotations map (tests
    add to it); other keys appear only when given."""
    metadata: dict[str, Any] = {"name": name if name is not None else f"pod-{next(_names)}"}
    if namespace is not None:
        metadata["namespace"] = namespace
    if uid is not None:
        metadata["uid"] = uid
    if resource_version is not None:
        metadata["resourceVersion"] = resource_version
    if labels is not None:
        metadata["labels"] = dict(labels)
    metadata["annotations"] = {**(annotations or {}), **({POLICY_ANNOTATION: policy} if policy else {})}
    spec: dict[str, Any] = {}
    if scheduler:
        spec["schedulerName"] = scheduler
    if node is not None:
        spec["nodeName"] = node
    if service_account:
        spec["serviceAccountName"] = service_account
    if node_selector is not None:
        spec["nodeSelector"] = dict(node_selector)
    if affinity is not None:
        spec["affinity"] = dict(affinity)
    if init_containers:
        spec["initContainers"] = list(init_containers)
    if containers is None:
        containers = [
            container(
                gpus=gpus,
                units=units,
                memory=memory,
                mig=mig,
                limits=limits,
                requests=requests,
                limits_only=limits_only,
                image=image,
            )
        ]
    spec["containers"] = list(containers)
    if overhead is not None:
        spec["overhead"] = dict(overhead)
    manifest: dict[str, Any] = {"metadata": metadata, "spec": spec}
    if phase is not None:
        manifest["status"] = {"phase": phase}
    return manifest


def api_pod_manifest(name: str, **kwargs: Any) -> dict[str, Any]:
    """The body that creates `pod_manifest(name, **kwargs)` through the API server: with
    `apiVersion` and `kind`, without a namespace (the request's path names it) or a status."""
    kwargs.setdefault("namespace", None)
    kwargs.setdefault("phase", None)
    return {"apiVersion": "v1", "kind": "Pod", **pod_manifest(name, **kwargs)}


def filter_args(manifest: dict[str, Any], nodes: Sequence[str]) -> dict[str, Any]:
    """The ExtenderArgs of filter and prioritize with node names (nodeCacheCapable: true)."""
    return {"Pod": manifest, "Nodes": None, "NodeNames": nodes}


def pod_info(
    name: str,
    *,
    uid: str | None = None,
    namespace: str = NAMESPACE,
    node: str = "node-a",
    phase: str = "Running",
    resource_version: str = "",
    record: Allocation | str | None = None,
    demands: tuple[ContainerDemand, ...] = (),
    created: dt.datetime | None = None,
    scheduled_at: dt.datetime | None = None,
) -> PodInfo:
    """The node agent's view of a pod on `node`: `record` is its allocation annotation (an
    `Allocation`, encoded, or the annotation's text as it stands); `uid` defaults to "uid-<name>"."""
    if isinstance(record, Allocation):
        record = encode_allocation(record)
    annotations = {ALLOCATION_ANNOTATION: record} if record is not None else {}
    return PodInfo(
        namespace=namespace,
        name=name,
        uid=uid if uid is not None else f"uid-{name}",
        resource_version=resource_version,
        node_name=node,
        phase=phase,
        annotations=MappingProxyType(annotations),
        demands=demands,
        created=created,
        scheduled_at=scheduled_at,
    )
