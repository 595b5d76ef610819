"""The API objects the plugin reads, decoded into frozen records. Pure: no I/O.

Every rule shared with the other programs comes from `contract`: the GpuTopology decoder, the
cordon annotation, the ledger and allocation formats, and the one `NodeState` builder, so a GPU
the extender will not place on is the GPU this plugin shows as unavailable. Malformed objects
become records that carry the reason, never exceptions: one bad node must not hide the others.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from contract.allocation import Allocation, AllocationError, decode_allocation
from contract.cordons import Cordons, parse_cordons
from contract.gpu_topology import GpuHealthEntry, GpuTopologyError, PublishedTopology, decode_gpu_topology
from contract.keys import ALLOCATION_ANNOTATION, CORDON_ANNOTATION, ledger_node
from contract.ledger import Ledger, LedgerError, ledger_from_config_map
from contract.node_state import build_node_state
from contract.pods import PodRef, pod_finished, pod_ref
from topology.accounting import Overcommit
from topology.scheduling import NodeState


@dataclass(frozen=True, slots=True)
class NodeCordons:
    """What the Node object says about GPU placement: the operator's cordons, `spec.unschedulable`."""

    name: str
    cordons: Cordons = field(default_factory=Cordons)
    unschedulable: bool = False


def node_cordons(obj: Mapping[str, Any]) -> NodeCordons:
    """A Node object (as JSON) into the facts that keep GPUs out of new placements."""
    meta = _mapping(obj, "metadata")
    raw = _mapping(meta, "annotations").get(CORDON_ANNOTATION)
    return NodeCordons(
        name=str(meta.get("name") or ""),
        cordons=parse_cordons(raw if isinstance(raw, str) else None),
        unschedulable=bool(_mapping(obj, "spec").get("unschedulable")),  # as the extender reads it
    )


def cordons_by_node(nodes: Iterable[Mapping[str, Any]]) -> dict[str, NodeCordons]:
    facts = (node_cordons(n) for n in nodes)
    return {f.name: f for f in facts if f.name}


@dataclass(frozen=True, slots=True)
class NodeReport:
    """One GPU node as the plugin shows it.

    `published` is None when the GpuTopology object is malformed (`error` says why); `state` is
    the node's state with its ledger's grants, built by `contract.node_state.build_node_state`.
    `node_cordons` is None when there is no Node object of that name, or when Nodes could not be read
    (`node_missing` tells the two apart)."""

    name: str
    published: PublishedTopology | None
    error: str = ""
    node_cordons: NodeCordons | None = None
    node_missing: bool = False
    ledger: Ledger | None = None
    ledger_error: str = ""
    state: NodeState | None = None
    overcommits: tuple[Overcommit, ...] = ()
    heartbeat: dt.datetime | None = None

    @property
    def health(self) -> tuple[GpuHealthEntry, ...]:
        return self.published.status.gpu_health if self.published else ()

    @property
    def unschedulable(self) -> bool:
        return self.node_cordons is not None and self.node_cordons.unschedulable

    @property
    def cordon_problems(self) -> tuple[str, ...]:
        """What is wrong with the cordon annotation: read here, as the agent reported it, and
        cordoned UUIDs that are no GPU of this node."""
        problems: list[str] = list(self.node_cordons.cordons.problems) if self.node_cordons else []
        if self.published is not None:
            problems += [p for p in self.published.status.cordon_problems if p not in problems]
            if self.node_cordons is not None:
                unknown = self.node_cordons.cordons.unknown(g.uuid for g in self.published.topology.gpus)
                problems += [
                    f"{CORDON_ANNOTATION} names {u}, which is not a GPU of this node" for u in unknown
                ]
        return tuple(problems)

    def reason(self, index: int) -> str:
        """The node agent's reason for GPU `index` being unhealthy ("" when it gives none)."""
        return next((h.reason for h in self.health if h.index == index), "")


def node_report(
    topology_obj: Mapping[str, Any],
    facts: Mapping[str, NodeCordons] | None,
    ledgers: Mapping[str, Ledger],
    units_per_gpu: int,
    ledger_errors: Mapping[str, str] | None = None,
) -> NodeReport:
    """A GpuTopology object with its Node's facts (None: Nodes unreadable) and its ledger."""
    name = str(_mapping(topology_obj, "metadata").get("name") or "?")
    node = facts.get(name) if facts is not None else None
    ledger = ledgers.get(name)
    ledger_error = (ledger_errors or {}).get(name, "")
    try:
        published = decode_gpu_topology(topology_obj)
    except GpuTopologyError as exc:
        return NodeReport(
            name=name,
            published=None,
            error=str(exc),
            node_cordons=node,
            node_missing=facts is not None and node is None,
            ledger=ledger,
            ledger_error=ledger_error,
            heartbeat=_raw_heartbeat(topology_obj),
        )
    state, overcommits = build_node_state(
        published,
        ledger.grants() if ledger is not None else (),
        units_per_gpu,
        node.cordons if node is not None else Cordons(),
        node.unschedulable if node is not None else False,
    )
    return NodeReport(
        name=published.node,
        published=published,
        node_cordons=node,
        node_missing=facts is not None and node is None,
        ledger=ledger,
        ledger_error=ledger_error,
        state=state,
        overcommits=overcommits,
        heartbeat=parse_time(published.status.heartbeat),
    )


def parse_time(raw: object) -> dt.datetime | None:
    """An RFC 3339 time (a zone-less one is taken as UTC); None when absent or unreadable."""
    if not isinstance(raw, str) or not raw:
        return None
    try:
        when = dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)


def _raw_heartbeat(obj: Mapping[str, Any]) -> dt.datetime | None:
    """The heartbeat of an object whose status may be malformed elsewhere."""
    return parse_time(_mapping(obj, "status").get("heartbeat"))


def ledgers_from(objs: Iterable[Mapping[str, Any]]) -> tuple[dict[str, Ledger], dict[str, str]]:
    """Ledger ConfigMaps by node, and the ones that could not be read (node -> why)."""
    ledgers: dict[str, Ledger] = {}
    errors: dict[str, str] = {}
    for obj in objs:
        try:
            ledger = ledger_from_config_map(obj)
        except LedgerError as exc:
            errors[_ledger_node_of(obj)] = str(exc)
            continue
        ledgers[ledger.node] = ledger
    return ledgers, errors


def _ledger_node_of(obj: Mapping[str, Any]) -> str:
    """The node of a ledger ConfigMap that could not be decoded (its name, without the prefix)."""
    return ledger_node(str(_mapping(obj, "metadata").get("name") or "?"))


def _mapping(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """`obj[key]` when it is an object, else an empty one (absent, null or the wrong type)."""
    value = obj.get(key)
    return value if isinstance(value, Mapping) else {}


@dataclass(frozen=True, slots=True)
class PodAllocation:
    """A pod carrying a `linkpack.io/allocation` annotation (`allocation` None: unreadable)."""

    ref: PodRef
    node_name: str
    phase: str
    finished: bool
    allocation: Allocation | None
    error: str = ""


def pod_allocations(pods: Iterable[Mapping[str, Any]]) -> list[PodAllocation]:
    """The pods that carry an allocation annotation, decoded (or with the decoder's complaint)."""
    out = []
    for pod in pods:
        raw = _mapping(_mapping(pod, "metadata"), "annotations").get(ALLOCATION_ANNOTATION)
        if raw is None:
            continue
        allocation: Allocation | None = None
        error = ""
        try:
            allocation = decode_allocation(str(raw))
        except AllocationError as exc:
            error = str(exc)
        out.append(
            PodAllocation(
                ref=pod_ref(pod),
                node_name=str(_mapping(pod, "spec").get("nodeName") or ""),
                phase=str(_mapping(pod, "status").get("phase") or ""),
                finished=pod_finished(pod),
                allocation=allocation,
                error=error,
            )
        )
    return out
