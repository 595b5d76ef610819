"""The GpuTopology object a node agent publishes about its node, spec and status.

One cluster-scoped object per GPU node, named after the node (`contract.keys`):
- spec: the topology codec (`topology.codec`, schema `linkpack.io/topology/v1`), rewritten
  only when its content hash (annotation `linkpack.io/topology-hash`) changes;
- status (status subresource): what the node says about itself now: per-GPU health, the GPU
  count (the printer column), whether a CUDA MPS control daemon serves its shares, problems
  with the operator's cordon annotation, node labels it left alone because someone else set
  them differently, the agent's version and its heartbeat.

The node agent encodes with these functions and the extender and the kubectl plugin decode
with them; a malformed status is an error naming the field, never a silent default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from contract.handoff import HoldsError, NodeHolds, decode_holds, encode_holds
from contract.keys import (
    AGENT_COMPONENT,
    MANAGED_BY_LABEL,
    TOPOLOGY_API_VERSION,
    TOPOLOGY_HASH_ANNOTATION,
    TOPOLOGY_KIND,
)
from topology.codec import CodecError, content_hash, encode_topology
from topology.codec_memo import decode_with_hash
from topology.model import NodeTopology


class GpuTopologyError(ValueError):
    """A GpuTopology object is malformed; the message names the node and the field path."""


@dataclass(frozen=True, slots=True)
class GpuHealthEntry:
    """One GPU's health as the node agent last saw it."""

    index: int
    uuid: str = ""
    healthy: bool = True
    reason: str = ""
    since: str = ""  # RFC 3339
    severity: str = ""  # class of the last fault: application, notice, needs-reset, fatal, or ""
    cordoned: bool = False


@dataclass(frozen=True, slots=True)
class GpuPower:
    """A GPU's power limit now and the range it may be set within (NVML), in watts."""

    index: int
    limit_w: int
    min_w: int = 0
    max_w: int = 0


@dataclass(frozen=True, slots=True)
class TopologyStatus:
    """The status of a GpuTopology object (without its heartbeat: see `encode_status`)."""

    gpu_health: tuple[GpuHealthEntry, ...] = ()
    gpu_count: int = 0
    agent_version: str = ""
    mps_active: bool = False  # a healthy MPS control daemon serves this node's shares
    interposer_available: bool = False  # the node can load the CUDA interposer into share containers
    driver_version: str = ""  # the NVIDIA driver, e.g. "550.54.15" ("" unknown)
    cuda_driver_version: str = ""  # the highest CUDA version that driver runs, e.g. "12.4"
    gpu_power: tuple[GpuPower, ...] = ()
    cordon_problems: tuple[str, ...] = ()
    label_conflicts: tuple[str, ...] = ()  # node labels the agent would set but someone else holds
    heartbeat: str = ""  # RFC 3339; "" when never written
    holds: NodeHolds | None = None  # pods the kubelet still holds our devices for (None: not reported)

    @property
    def unhealthy(self) -> frozenset[int]:
        return frozenset(h.index for h in self.gpu_health if not h.healthy)


@dataclass(frozen=True, slots=True)
class PublishedTopology:
    """A decoded GpuTopology object."""

    node: str
    topology: NodeTopology
    content_hash: str
    status: TopologyStatus
    resource_version: str = ""


def encode_status(status: TopologyStatus, *, with_heartbeat: bool = True) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "gpuHealth": [
            {
                "index": h.index,
                "uuid": h.uuid,
                "healthy": h.healthy,
                "reason": h.reason,
                "since": h.since,
                "severity": h.severity,
                "cordoned": h.cordoned,
            }
            for h in status.gpu_health
        ],
        "gpuCount": status.gpu_count,
        "agentVersion": status.agent_version,
        "mps": {"active": status.mps_active},
        "interposer": {"available": status.interposer_available},
        "driver": {"version": status.driver_version, "cudaVersion": status.cuda_driver_version},
        "gpuPower": [
            {"index": p.index, "limitW": p.limit_w, "minW": p.min_w, "maxW": p.max_w}
            for p in status.gpu_power
        ],
        "cordonProblems": list(status.cordon_problems),
        "labelConflicts": list(status.label_conflicts),
    }
    if status.holds is not None:
        doc["held"] = encode_holds(status.holds)
    if with_heartbeat and status.heartbeat:
        doc["heartbeat"] = status.heartbeat
    return doc


def decode_status(raw: object, node: str = "?") -> TopologyStatus:
    """The status of a GpuTopology; an absent status (not yet written) is an empty one."""
    where = f"GpuTopology {node}: status"
    if raw is None:
        return TopologyStatus()
    doc = _object(raw, where)
    health = tuple(
        _health(entry, where, i) for i, entry in enumerate(_list(doc.get("gpuHealth"), f"{where}.gpuHealth"))
    )
    mps = _object(doc.get("mps") or {}, f"{where}.mps")
    interposer = _object(doc.get("interposer") or {}, f"{where}.interposer")
    driver = _object(doc.get("driver") or {}, f"{where}.driver")
    return TopologyStatus(
        gpu_health=health,
        gpu_count=_int(doc.get("gpuCount", 0), f"{where}.gpuCount"),
        agent_version=_str(doc.get("agentVersion", ""), f"{where}.agentVersion"),
        mps_active=_bool(mps.get("active", False), f"{where}.mps.active"),
        interposer_available=_bool(interposer.get("available", False), f"{where}.interposer.available"),
        driver_version=_str(driver.get("version", ""), f"{where}.driver.version"),
        cuda_driver_version=_str(driver.get("cudaVersion", ""), f"{where}.driver.cudaVersion"),
        gpu_power=tuple(
            _power(entry, f"{where}.gpuPower[{i}]")
            for i, entry in enumerate(_list(doc.get("gpuPower"), f"{where}.gpuPower"))
        ),
        cordon_problems=tuple(
            _str(p, f"{where}.cordonProblems[{i}]")
            for i, p in enumerate(_list(doc.get("cordonProblems"), f"{where}.cordonProblems"))
        ),
        label_conflicts=tuple(
            _str(c, f"{where}.labelConflicts[{i}]")
            for i, c in enumerate(_list(doc.get("labelConflicts"), f"{where}.labelConflicts"))
        ),
        heartbeat=_str(doc.get("heartbeat", ""), f"{where}.heartbeat"),
        holds=_holds(doc.get("held"), f"{where}.held"),
    )


def _holds(raw: object, where: str) -> NodeHolds | None:
    if raw is None:
        return None
    try:
        return decode_holds(raw, where)
    except HoldsError as exc:
        raise GpuTopologyError(str(exc)) from exc


def topology_object(node: str, topology: NodeTopology, resource_version: str = "") -> dict[str, Any]:
    """The whole object to create or replace (spec and metadata; the status is written apart)."""
    metadata: dict[str, Any] = {
        "name": node,
        "labels": {MANAGED_BY_LABEL: AGENT_COMPONENT},
        "annotations": {TOPOLOGY_HASH_ANNOTATION: content_hash(topology)},
    }
    if resource_version:
        metadata["resourceVersion"] = resource_version
    return {
        "apiVersion": TOPOLOGY_API_VERSION,
        "kind": TOPOLOGY_KIND,
        "metadata": metadata,
        "spec": encode_topology(topology),
    }


def published_hash(obj: Mapping[str, Any]) -> str:
    """The spec's content hash as the object's annotation records it ("" when absent)."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(TOPOLOGY_HASH_ANNOTATION) or "")


def decode_gpu_topology(obj: Mapping[str, Any]) -> PublishedTopology:
    """A GpuTopology object as JSON into our types; GpuTopologyError names what is wrong."""
    meta = _object(obj.get("metadata") or {}, "GpuTopology: metadata")
    node = _str(meta.get("name") or "", "GpuTopology: metadata.name")
    if not node:
        raise GpuTopologyError("GpuTopology: metadata.name is empty")
    try:
        topology, digest = decode_with_hash(obj.get("spec") or {})
    except CodecError as exc:
        raise GpuTopologyError(f"GpuTopology {node}: spec: {exc}") from exc
    status = decode_status(obj.get("status"), node)
    return PublishedTopology(
        node=node,
        topology=topology,
        content_hash=digest,
        status=status,
        resource_version=str(meta.get("resourceVersion") or ""),
    )


# ----------------------------------------------------------------------------- field readers


def _health(raw: object, status: str, position: int) -> GpuHealthEntry:
    """One gpuHealth entry; the usual one (a dict of exactly the expected types) without a check
    per field, any other through the checks that name what is wrong."""
    if type(raw) is dict:
        index, healthy, cordoned = raw.get("index"), raw.get("healthy"), raw.get("cordoned", False)
        uuid, reason = raw.get("uuid", ""), raw.get("reason", "")
        since, severity = raw.get("since", ""), raw.get("severity", "")
        if (
            type(index) is int
            and index >= 0
            and type(healthy) is bool
            and type(cordoned) is bool
            and type(uuid) is str
            and type(reason) is str
            and type(since) is str
            and type(severity) is str
        ):
            return GpuHealthEntry(index, uuid, healthy, reason, since, severity, cordoned)
    return _checked_health(raw, f"{status}.gpuHealth[{position}]")


def _checked_health(raw: object, where: str) -> GpuHealthEntry:
    doc = _object(raw, where)
    if "index" not in doc or "healthy" not in doc:
        raise GpuTopologyError(f"{where}: 'index' and 'healthy' are required")
    return GpuHealthEntry(
        index=_int(doc["index"], f"{where}.index"),
        uuid=_str(doc.get("uuid", ""), f"{where}.uuid"),
        healthy=_bool(doc["healthy"], f"{where}.healthy"),
        reason=_str(doc.get("reason", ""), f"{where}.reason"),
        since=_str(doc.get("since", ""), f"{where}.since"),
        severity=_str(doc.get("severity", ""), f"{where}.severity"),
        cordoned=_bool(doc.get("cordoned", False), f"{where}.cordoned"),
    )


def _power(raw: object, where: str) -> GpuPower:
    doc = _object(raw, where)
    if "index" not in doc or "limitW" not in doc:
        raise GpuTopologyError(f"{where}: 'index' and 'limitW' are required")
    return GpuPower(
        index=_int(doc["index"], f"{where}.index"),
        limit_w=_int(doc["limitW"], f"{where}.limitW"),
        min_w=_int(doc.get("minW", 0), f"{where}.minW"),
        max_w=_int(doc.get("maxW", 0), f"{where}.maxW"),
    )


def _object(raw: object, where: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise GpuTopologyError(f"{where}: expected an object, got {type(raw).__name__}")
    return raw


def _list(raw: object, where: str) -> list[Any]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise GpuTopologyError(f"{where}: expected a list, got {type(raw).__name__}")
    return raw


def _int(raw: object, where: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise GpuTopologyError(f"{where}: expected a non-negative integer, got {raw!r}")
    return raw


def _str(raw: object, where: str) -> str:
    if not isinstance(raw, str):
        raise GpuTopologyError(f"{where}: expected a string, got {type(raw).__name__}")
    return raw


def _bool(raw: object, where: str) -> bool:
    if not isinstance(raw, bool):
        raise GpuTopologyError(f"{where}: expected true or false, got {raw!r}")
    return raw


def as_published(
    node: str,
    topology: NodeTopology,
    *,
    unhealthy: frozenset[int] = frozenset(),
    mps_active: bool = False,
    interposer_available: bool = False,
    resource_version: str = "",
) -> PublishedTopology:
    """A PublishedTopology for a node the caller describes directly (simulations, demos, tests)."""
    health = tuple(
        GpuHealthEntry(index=g.index, uuid=g.uuid, healthy=g.index not in unhealthy) for g in topology.gpus
    )
    status = TopologyStatus(
        gpu_health=health,
        gpu_count=topology.gpu_count,
        mps_active=mps_active,
        interposer_available=interposer_available,
    )
    return PublishedTopology(node, topology, content_hash(topology), status, resource_version)
