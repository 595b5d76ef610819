"""`nodes`, `topo` and `pods` as text, from the frozen records of `kubectl_linkpack.decoded`. Pure.

A GPU's state is one word of `topology.gpu_status` (the extender's debug page uses the same
words), read from the `NodeState` that `contract.node_state` built, so a GPU cordoned by the
Node annotation or on an unschedulable Node shows as cordoned here exactly when the extender
keeps new pods off it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence

from contract.keys import ledger_name
from contract.ledger import Ledger
from contract.resources import ResourceNames
from kubectl_linkpack.decoded import NodeReport, PodAllocation
from kubectl_linkpack.tables import age, gib, share_text, table
from topology.gpu_status import GPU_STATUSES, gpu_status, model_of
from topology.graph import build_graph, gpu_vertex, nic_vertex
from topology.model import LinkKind
from topology.scheduling import NodeState

NO_TOPOLOGIES = "No GpuTopology objects found: is the node agent running?"
NO_ALLOCATIONS = "No GPU allocations found."

# ----------------------------------------------------------------------------- nodes


def format_nodes(
    records: Sequence[NodeReport],
    ledgers: Mapping[str, Ledger],
    now: dt.datetime,
    ledger_errors: Mapping[str, str] | None = None,
    notes: Sequence[str] = (),
) -> str:
    """`kubectl linkpack nodes`: one line per GPU node, then warnings about what could not be read."""
    headers = [
        "NODE",
        "MODEL",
        "GPUS",
        *(s.upper() for s in GPU_STATUSES),
        "FREE-MEM",
        "PODS",
        "HEARTBEAT",
        "HEALTH",
    ]
    blanks = ["-"] * (2 + len(GPU_STATUSES) + 1)
    errors = dict(ledger_errors or {})
    rows: list[list[str]] = []
    warnings: list[str] = []
    for record in sorted(records, key=lambda r: r.name):
        pods = "?" if record.ledger_error else str(len(record.ledger.entries) if record.ledger else 0)
        heartbeat = age(record.heartbeat, now)
        warnings += [f"node {record.name}: {problem}" for problem in _node_problems(record)]
        state = record.state
        if state is None:
            rows.append([record.name, *blanks, pods, heartbeat, record.error])
            continue
        counts = dict.fromkeys(GPU_STATUSES, 0)
        for usage in state.usage:
            counts[gpu_status(usage)] += 1
        free_memory = sum(state.free_memory_mib(i) for i, u in enumerate(state.usage) if u.usable)
        rows.append(
            [
                record.name,
                model_of(state) or "?",
                str(state.topology.gpu_count),
                *(str(counts[s]) for s in GPU_STATUSES),
                gib(free_memory),
                pods,
                heartbeat,
                _health_cell(record),
            ]
        )
    named = {r.name for r in records}
    for node in sorted((set(ledgers) | set(errors)) - named):
        entries = str(len(ledgers[node].entries)) if node in ledgers else "?"
        rows.append([node, *blanks, entries, "-", "no GpuTopology (ledger only)"])
    text = table(headers, rows) if rows else NO_TOPOLOGIES
    lines = [text, *(f"warning: {w}" for w in warnings)]
    lines += [f"warning: {ledger_warning(node, error)}" for node, error in sorted(errors.items())]
    lines += [f"warning: {note}" for note in notes]
    return "\n".join(lines)


def ledger_warning(node: str, error: str) -> str:
    return f"ledger ConfigMap {ledger_name(node)} is unreadable: {error}"


def _health_cell(record: NodeReport) -> str:
    """Why GPUs of this node are out of service, in short; details follow the table."""
    parts = [f"GPU{h.index}: {h.reason or 'unhealthy'}" for h in record.health if not h.healthy]
    if record.unschedulable:
        parts.append("node unschedulable: no new placements")
    if record.node_missing:
        parts.append("no Node object")
    if record.cordon_problems:
        parts.append(f"{len(record.cordon_problems)} cordon annotation problem(s)")
    if record.overcommits:
        parts.append("ledger overcommits a GPU")
    if record.ledger_error:
        parts.append("ledger unreadable")
    return "; ".join(parts) or "ok"


def _node_problems(record: NodeReport) -> list[str]:
    """What needs an operator's attention beyond the health column (printed as warnings)."""
    return [*record.cordon_problems, *(f"ledger overcommits: {o.detail}" for o in record.overcommits)]


# ----------------------------------------------------------------------------- topo

TOPO_LEGEND = """\
Legend (numbers are GB/s per direction, estimated from the GPU model and the link kind):
  X     = self
  NV#   = NVLink with # links, directly or through NVSwitch
  INTERNAL = same board (dual-GPU card)
  PIX   = one PCIe switch
  PXB   = several PCIe switches, no host bridge
  PHB   = a PCIe host bridge
  NODE  = host bridges within one NUMA node
  SYS   = across NUMA nodes (the socket interconnect)"""


def format_topo(record: NodeReport) -> str:
    """`kubectl linkpack topo NODE`: the link matrix with Linkpack's kinds and bandwidth, then what
    each GPU is doing and what keeps GPUs out of new placements."""
    if record.published is None or record.state is None:
        return record.error
    topology = record.published.topology
    graph = build_graph(topology)
    gpus = [g.index for g in topology.gpus]
    nics = [n.index for n in topology.nics]
    names = [*(f"GPU{i}" for i in gpus), *(f"NIC{k}" for k in nics)]
    vertices = [*(gpu_vertex(i) for i in gpus), *(nic_vertex(k) for k in nics)]
    rows = []
    for position, (name, vertex) in enumerate(zip(names, vertices, strict=True)):
        cells = []
        for other in vertices:
            if other == vertex:
                cells.append("X")
            elif graph.has_edge(vertex, other) and graph.edges[vertex, other]["role"] == "direct":
                edge = graph.edges[vertex, other]
                cells.append(_cell(edge["kind"], int(edge["nvlinks"]), float(edge["bandwidth"])))
            else:
                cells.append("-")
        if position < len(gpus):
            gpu = topology.gpus[position]
            cells += [str(gpu.numa_node) if gpu.numa_node is not None else "N/A", gpu.cpu_affinity or "N/A"]
        else:
            cells += ["", ""]
        rows.append([name, *cells])
    models = sorted({g.model for g in topology.gpus if g.model})
    head = f"Node {record.name}: {len(gpus)} x {', '.join(models) or 'unknown model'}"
    if topology.nvswitch:
        head += f", NVSwitch (NV{max((lk.nvlinks for lk in topology.gpu_links), default=0)} per GPU)"
    parts = [head, table(["", *names, "NUMA", "CPU Affinity"], rows), "", TOPO_LEGEND]
    if topology.nics:
        parts += ["", "NICs:", *(f"  NIC{n.index}: {n.name}" for n in topology.nics)]
    parts += ["", "GPUs:"]
    parts += [f"  GPU{g.index}: {_gpu_text(record, record.state, i)}" for i, g in enumerate(topology.gpus)]
    notes = list(_topo_notes(record))
    if notes:
        parts += ["", *notes]
    return "\n".join(parts)


def _cell(kind: LinkKind, nvlinks: int, bandwidth: float) -> str:
    label = f"NV{nvlinks}" if kind is LinkKind.NV else kind.value
    return f"{label} {bandwidth:.3g}"


def _gpu_text(record: NodeReport, state: NodeState, position: int) -> str:
    """`whole`, `shared (...)`, `unhealthy (reason)`, `cordoned; still held: ...` for one GPU."""
    usage = state.usage[position]
    gpu = state.topology.gpus[position]
    word = gpu_status(usage)
    use = _use_text(state, position)
    if word == "shared":
        return f"shared ({use})"
    if word == "unhealthy":
        reason = record.reason(gpu.index)
        text = "unhealthy" + (", cordoned" if usage.cordoned else "") + (f" ({reason})" if reason else "")
        return text + (f"; still held: {use}" if use else "")
    if word == "cordoned":
        return "cordoned" + (f"; still held: {use}" if use else "")
    return word


def _use_text(state: NodeState, position: int) -> str:
    usage = state.usage[position]
    gpu = state.topology.gpus[position]
    if usage.idle:
        return ""
    if usage.whole:
        return "whole"
    if usage.mig_used:
        return f"{len(usage.mig_used)} of {len(gpu.mig_devices)} MIG instances"
    return (
        f"{usage.memory_used_mib} of {gpu.memory_mib} MiB, {usage.units_used} of {state.units_per_gpu} units"
    )


def _topo_notes(record: NodeReport) -> Iterable[str]:
    if record.unschedulable:
        yield "Node is unschedulable (kubectl cordon): no GPU of it takes new pods."
    if record.node_missing:
        yield f"No Node object named {record.name}: cordons cannot be read."
    for problem in _node_problems(record):
        yield f"warning: {problem}"
    if record.ledger_error:
        yield f"warning: {ledger_warning(record.name, record.ledger_error)}"


# ----------------------------------------------------------------------------- pods


def format_pods(
    ledgers: Mapping[str, Ledger],
    pods: Sequence[PodAllocation],
    names: ResourceNames,
    namespace: str | None = None,
) -> str:
    """`kubectl linkpack pods`: every allocation in the ledgers, checked against the pods."""
    by_uid = {p.ref.uid: p for p in pods}
    rows = []
    seen: set[str] = set()
    for node in sorted(ledgers):
        for entry in ledgers[node].entries:
            if namespace is not None and entry.namespace != namespace:
                continue
            seen.add(entry.pod_uid)
            pod = by_uid.get(entry.pod_uid)
            a = entry.allocation
            if pod is None:
                state = "pod not found (stale; the extender releases it)"
            elif pod.allocation != a:
                state = "pod annotation differs from the ledger"
            elif pod.finished:
                state = f"finished ({pod.phase})"
            elif pod.node_name == node:
                state = "bound"
            elif pod.node_name:
                state = f"bound to another node ({pod.node_name})"
            else:
                state = "reserved, not bound yet"
            rows.append(
                [
                    entry.namespace,
                    entry.name,
                    node,
                    ",".join(str(i) for i in a.gpu_indices),
                    share_text(a.grants, (r for r, _ in a.resources), names),
                    a.enforcement.value,
                    state,
                ]
            )
    for pod in sorted(pods, key=lambda p: (p.ref.namespace, p.ref.name)):
        if pod.ref.uid in seen or (namespace is not None and pod.ref.namespace != namespace):
            continue
        ns, name = pod.ref.namespace, pod.ref.name
        if pod.allocation is None:
            rows.append([ns, name, pod.node_name or "-", "-", "-", "-", f"bad annotation: {pod.error}"])
            continue
        a = pod.allocation
        rows.append(
            [
                ns,
                name,
                a.node,
                ",".join(str(i) for i in a.gpu_indices),
                share_text(a.grants, (r for r, _ in a.resources), names),
                a.enforcement.value,
                f"finished ({pod.phase}), released" if pod.finished else "annotation only: not in the ledger",
            ]
        )
    if not rows:
        return NO_ALLOCATIONS
    return table(["NAMESPACE", "NAME", "NODE", "GPUS", "SHARE", "ENFORCEMENT", "STATE"], rows)
