"""GET /debug/topology and GET /debug/topology/{node} as JSON-ready dicts.

Pure functions of `TrackedNode` values. Keys are camelCase like the rest of Linkpack's API
objects; memory is in MiB, bandwidth in GB/s per direction, fragmentation in milli-GPU (the FGD
measure of `topology.fragmentation`). The HTML pages (`extender.debug.views.pages`) show the same
facts, from the same `node_summary`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from contract.ledger import LedgerEntry
from extender.debug.views.occupants import NO_TOPOLOGY_MESSAGE, Occupant, occupants_by_gpu
from extender.state.snapshot import TrackedNode
from topology.fragmentation import node_state_fragmentation
from topology.gpu_status import GPU_STATUSES, gpu_status, model_of
from topology.graph import build_graph
from topology.scheduling import GpuGrant, NodeState

Doc = dict[str, Any]


def iso_time(seconds: float) -> str:
    """Unix seconds as an RFC 3339 UTC timestamp ("2024-05-01T12:00:00Z")."""
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def status_counts(state: NodeState) -> dict[str, int]:
    """How many of the node's GPUs are in each state, every state present (in legend order)."""
    counts = Counter(gpu_status(u) for u in state.usage)
    return {status: counts.get(status, 0) for status in GPU_STATUSES}


def node_summary(snap: TrackedNode) -> Doc:
    """One row of the cluster overview."""
    base: Doc = {
        "name": snap.name,
        "unschedulable": bool(snap.facts and snap.facts.unschedulable),
        "pods": len(snap.ledger.entries),
        # what is wrong with the operator's cordon annotation, and with the published topology
        "cordonProblems": list(snap.facts.cordons.problems) if snap.facts else [],
        "cordonProblemsReported": list(snap.published.status.cordon_problems) if snap.published else [],
        "mps": snap.mps_active,
    }
    state = snap.state
    if state is None:
        return {
            **base,
            "hasTopology": False,
            "topologyProblem": snap.topology_problem,
            "gpus": 0,
            "model": "",
            **{status: 0 for status in GPU_STATUSES},
            "freeMemoryMiB": 0,
            "totalMemoryMiB": 0,
            "freeUnits": 0,
            "fragmentationMilliGpu": 0.0,
            "message": f"{NO_TOPOLOGY_MESSAGE} ({snap.topology_problem})"
            if snap.topology_problem
            else NO_TOPOLOGY_MESSAGE,
        }
    usable = [i for i, u in enumerate(state.usage) if u.usable]
    return {
        **base,
        "hasTopology": True,
        "gpus": state.topology.gpu_count,
        "model": model_of(state),
        "nvswitch": state.topology.nvswitch,
        "nics": len(state.topology.nics),
        **status_counts(state),
        "freeMemoryMiB": sum(state.free_memory_mib(i) for i in usable),
        "totalMemoryMiB": sum(g.memory_mib for g in state.topology.gpus),
        "freeUnits": sum(state.free_units(i) for i in usable),
        "unitsPerGpu": state.units_per_gpu,
        "fragmentationMilliGpu": round(node_state_fragmentation(state), 1),
        "overcommitted": bool(snap.overcommits),
    }


def topology_index(snaps: Sequence[TrackedNode]) -> Doc:
    """GET /debug/topology: every node in one line, and cluster totals."""
    rows = [node_summary(s) for s in snaps]
    totals: Doc = {
        "nodes": len(rows),
        "nodesWithoutTopology": sum(1 for r in rows if not r["hasTopology"]),
    }
    for key in ("gpus", *GPU_STATUSES, "freeMemoryMiB", "totalMemoryMiB", "pods"):
        totals[key] = sum(int(r[key]) for r in rows)
    return {"nodes": rows, "totals": totals}


def grant_doc(grant: GpuGrant) -> Doc:
    return {
        "index": grant.index,
        "uuid": grant.uuid,
        "whole": grant.whole,
        "memoryMiB": grant.memory_mib,
        "units": grant.units,
        "migUuid": grant.mig_uuid,
    }


def _holder_doc(h: Occupant) -> Doc:
    g = h.grant
    return {
        "namespace": h.namespace,
        "name": h.name,
        "uid": h.uid,
        "whole": g.whole,
        "memoryMiB": g.memory_mib,
        "units": g.units,
        "migUuid": g.mig_uuid,
    }


def _gpu_doc(state: NodeState, index: int, held: Sequence[Occupant]) -> Doc:
    gpu = state.topology.gpus[index]
    usage = state.usage[index]
    return {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "model": gpu.model,
        "pciBusId": gpu.pci_bus_id,
        "numaNode": gpu.numa_node,
        "cpuAffinity": gpu.cpu_affinity,
        "status": gpu_status(usage),
        "healthy": usage.healthy,
        "cordoned": usage.cordoned,
        "memoryMiB": gpu.memory_mib,
        "usedMemoryMiB": gpu.memory_mib if usage.whole else usage.memory_used_mib,
        "freeMemoryMiB": state.free_memory_mib(index) if usage.usable else 0,
        "unitsPerGpu": state.units_per_gpu,
        "usedUnits": state.units_per_gpu if usage.whole else usage.units_used,
        "freeUnits": state.free_units(index) if usage.usable else 0,
        "migMode": gpu.mig_mode.value,
        "migDevices": [
            {
                "uuid": m.uuid,
                "profile": m.profile,
                "memoryMiB": m.memory_mib,
                "inUse": m.uuid in usage.mig_used,
            }
            for m in gpu.mig_devices
        ],
        "holders": [_holder_doc(h) for h in held],
    }


def entry_doc(entry: LedgerEntry) -> Doc:
    """One pod's committed allocation (a ledger entry)."""
    a = entry.allocation
    return {
        "namespace": entry.namespace,
        "name": entry.name,
        "uid": entry.pod_uid,
        "node": a.node,
        "gpus": list(a.gpu_indices),
        "grants": [grant_doc(g) for g in a.grants],
        "enforcement": a.enforcement.value,
        "generation": a.generation,
        "resources": dict(a.resources),
        "reservedAt": iso_time(entry.reserved_at),
    }


def graph_doc(state: NodeState) -> Doc:
    """The node's graph (topology.graph): vertices and edges, sorted, with kinds and bandwidth."""
    graph = build_graph(state.topology)
    vertices = [
        {"id": str(v), **{k: (val.value if hasattr(val, "value") else val) for k, val in attrs.items()}}
        for v, attrs in sorted(graph.nodes(data=True), key=lambda item: str(item[0]))
    ]
    edges = []
    for u, v, attrs in graph.edges(data=True):
        a, b = sorted((str(u), str(v)))
        edges.append(
            {
                "source": a,
                "target": b,
                "kind": attrs["kind"].value,
                "nvlinks": int(attrs["nvlinks"]),
                "bandwidthGBps": float(attrs["bandwidth"]),
                "role": attrs["role"],
            }
        )
    edges.sort(key=lambda e: (e["role"], e["source"], e["target"]))
    return {"vertices": vertices, "edges": edges}


def node_detail(snap: TrackedNode) -> Doc:
    """GET /debug/topology/{node}: GPUs, their use and holders, the graph, the pods, the problems."""
    doc: Doc = {"node": node_summary(snap)}
    state = snap.state
    if state is None or snap.published is None:
        return {**doc, "gpus": [], "graph": {"vertices": [], "edges": []}, "pods": [], "problems": []}
    held = occupants_by_gpu(snap.ledger)
    topology = state.topology
    return {
        **doc,
        "contentHash": snap.published.content_hash,
        "sources": dict(topology.sources),
        "warnings": list(topology.warnings),
        "gpus": [_gpu_doc(state, i, held.get(i, ())) for i in range(topology.gpu_count)],
        "nics": [{"index": n.index, "name": n.name} for n in topology.nics],
        "links": [
            {
                "a": link.a,
                "b": link.b,
                "kind": link.kind.value,
                "nvlinks": link.nvlinks,
            }
            for link in topology.gpu_links
        ],
        "graph": graph_doc(state),
        "pods": [entry_doc(e) for e in snap.ledger.entries],
        "ledgerResourceVersion": snap.ledger.resource_version,
        "problems": [{"gpu": p.gpu, "detail": p.detail} for p in snap.overcommits],
    }
