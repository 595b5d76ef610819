"""Self-contained HTML pages of the debug views, with the node's graph drawn as inline SVG.

Nothing is fetched by the browser: no scripts, fonts or style sheets from elsewhere (GPU
machines often have no internet). Pure functions of `NodeSnapshot` values.

Layout of a node (`radial_layout`): a radial tree. GPUs and NICs sit on one ring in the order
of the PCIe tree (NUMA node, host bridge, bridge, switch), so devices under one switch are
neighbours; every inferred switch, bridge and NUMA node sits on an outer ring at the middle
of the devices beneath it; NVSwitch is the centre. NVLink pairs of boards without NVSwitch are
chords across the ring. Colours: GPUs by use, links by kind; line width grows with bandwidth.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html import escape

import networkx as nx

from extender.debug_views import (
    GPU_STATUSES,
    NO_TOPOLOGY_MESSAGE,
    Holding,
    NodeSnapshot,
    gpu_status,
    holdings,
    model_of,
    node_summary,
)
from topology.graph import NVSWITCH, build_graph, fabric_view
from topology.model import LinkKind, NodeTopology
from topology.workload import NodeState

STATUS_COLOURS = {
    "free": "#b9e4c9",
    "shared": "#ffe082",
    "whole": "#64a8f0",
    "unhealthy": "#ef6f6c",
    "cordoned": "#b8b8b8",
}
STATUS_MEANING = {
    "free": "idle, can be handed out whole or shared",
    "shared": "partly used by GPU shares or MIG instances",
    "whole": "held whole by one pod",
    "unhealthy": "reported unhealthy by the node agent",
    "cordoned": "cordoned (linkpack.io/cordoned-gpus or node unschedulable)",
}
KIND_COLOURS = {
    LinkKind.NV: "#3f9b0b",
    LinkKind.INTERNAL: "#009e9e",
    LinkKind.PIX: "#1f5fbf",
    LinkKind.PXB: "#7b4fc9",
    LinkKind.PHB: "#e07b00",
    LinkKind.NODE: "#8a5a44",
    LinkKind.SYS: "#c62828",
}
KIND_MEANING = {
    LinkKind.NV: "NVLink (direct or through NVSwitch)",
    LinkKind.INTERNAL: "same board (dual-GPU card)",
    LinkKind.PIX: "one PCIe switch",
    LinkKind.PXB: "several PCIe switches, no host bridge",
    LinkKind.PHB: "through a PCIe host bridge",
    LinkKind.NODE: "host bridges within one NUMA node",
    LinkKind.SYS: "across NUMA nodes (socket interconnect)",
}
_LEVEL = {"gpu": 0, "nic": 0, "pcie_switch": 1, "pcie_bridge": 2, "host_bridge": 3, "numa": 4, "host": 4}
_GPU_W, _GPU_H = 100.0, 60.0
_NIC_W, _NIC_H = 58.0, 20.0
_ARC_PER_WEIGHT = 132.0  # px of device ring per GPU
_NIC_WEIGHT = 0.5
_GROUP_GAP = 0.3  # extra weight between NUMA groups
_RING_STEP = 72.0
_MARGIN = 64.0
_MAX_SHOWN = 800.0  # px; larger drawings are scaled down to fit beside the legend


@dataclass(frozen=True, slots=True)
class Point:
    x: float
    y: float


@dataclass(frozen=True)
class Layout:
    """Where every graph vertex goes: an angle and a radius around `center`.

    A switch, bridge or NUMA node spans the arc `arcs[v]` over its children (drawn as a bus
    its children connect to radially); its box sits at the middle of that arc. `sys_radius`
    is the ring joining the NUMA nodes (0 when there is only one).
    """

    size: float
    center: Point
    angles: dict[str, float]
    radii: dict[str, float]
    arcs: dict[str, tuple[float, float]]
    parent: dict[str, str]
    sys_radius: float

    def at(self, vertex: str) -> Point:
        return self.polar(self.radii.get(vertex, 0.0), self.angles.get(vertex, 0.0))

    def polar(self, radius: float, angle: float) -> Point:
        return Point(
            round(self.center.x + radius * math.cos(angle), 1),
            round(self.center.y + radius * math.sin(angle), 1),
        )


def line_width(bandwidth_gbps: float) -> float:
    """Stroke width for a link: grows with the square root of its bandwidth (~3 px at 25 GB/s)."""
    return round(1.0 + 0.45 * math.sqrt(max(bandwidth_gbps, 0.0)), 2)


def _tree(graph: nx.Graph) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Parent of each vertex in the PCIe/NUMA tree (fabric edges between different levels)."""
    parent: dict[str, str] = {}
    for u, v in sorted(fabric_view(graph).edges(), key=lambda e: tuple(sorted(map(str, e)))):
        if NVSWITCH in (u, v):
            continue
        lu, lv = _LEVEL[graph.nodes[u]["type"]], _LEVEL[graph.nodes[v]["type"]]
        if lu == lv:
            continue
        child, up = (str(u), str(v)) if lu < lv else (str(v), str(u))
        parent.setdefault(child, up)
    children: dict[str, list[str]] = {}
    for child, up in parent.items():
        children.setdefault(up, []).append(child)
    return parent, children


def _device_order(graph: nx.Graph) -> list[list[str]]:
    """Devices grouped by tree root (NUMA node or host), each group in depth-first tree order."""
    parent, children = _tree(graph)

    def first_key(vertex: str) -> tuple[int, int]:
        data = graph.nodes[vertex]
        if data["type"] == "gpu":
            return (0, int(data["index"]))
        if data["type"] == "nic":
            return (1, int(data["index"]))
        return min((first_key(c) for c in children.get(vertex, ())), default=(2, 0))

    def walk(vertex: str) -> list[str]:
        if graph.nodes[vertex]["type"] in ("gpu", "nic"):
            return [vertex]
        out: list[str] = []
        for child in sorted(children.get(vertex, ()), key=lambda c: (first_key(c), c)):
            out.extend(walk(child))
        return out

    roots = [
        str(v)
        for v, d in graph.nodes(data=True)
        if d["type"] != "nvswitch"
        and str(v) not in parent
        and (children.get(str(v)) or d["type"] in ("gpu", "nic"))
    ]
    roots.sort(key=lambda r: (first_key(r), r))
    return [walk(r) for r in roots]


def radial_layout(topology: NodeTopology, graph: nx.Graph | None = None) -> Layout:
    """Deterministic positions for the graph of `topology` (see the module docstring)."""
    graph = graph if graph is not None else build_graph(topology)
    groups = [g for g in _device_order(graph) if g]
    weights = [[1.0 if graph.nodes[d]["type"] == "gpu" else _NIC_WEIGHT for d in g] for g in groups]
    gap = _GROUP_GAP if len(groups) > 1 else 0.0
    total = sum(sum(w) for w in weights) + gap * len(groups)
    device_radius = max(150.0, total * _ARC_PER_WEIGHT / (2 * math.pi))
    angles: dict[str, float] = {}
    radii: dict[str, float] = {}
    cursor = gap / 2
    for group, ws in zip(groups, weights, strict=True):
        for device, w in zip(group, ws, strict=True):
            angles[device] = -math.pi / 2 + 2 * math.pi * (cursor + w / 2) / max(total, 1e-9)
            radii[device] = device_radius
            cursor += w
        cursor += gap
    parent, children = _tree(graph)
    present = sorted({_LEVEL[d["type"]] for _, d in graph.nodes(data=True) if d["type"] in _LEVEL} - {0})
    ring = {level: device_radius + 72.0 + _RING_STEP * i for i, level in enumerate(present)}
    arcs: dict[str, tuple[float, float]] = {}
    by_level = sorted(
        (str(v) for v, d in graph.nodes(data=True) if _LEVEL.get(d["type"], 0) > 0),
        key=lambda v: (_LEVEL[graph.nodes[v]["type"]], v),
    )
    for vertex in by_level:
        placed = [angles[c] for c in children.get(vertex, ()) if c in angles]
        if not placed:
            continue
        arcs[vertex] = (min(placed), max(placed))
        angles[vertex] = (min(placed) + max(placed)) / 2
        radii[vertex] = ring[_LEVEL[graph.nodes[vertex]["type"]]]
    roots = [v for v in by_level if graph.nodes[v]["type"] in ("numa", "host") and v in angles]
    outer = max(ring.values(), default=device_radius)
    sys_radius = outer + 30.0 if len(roots) > 1 else 0.0
    size = 2 * (max(outer, sys_radius) + _MARGIN + 30.0)
    if NVSWITCH in graph:
        angles[NVSWITCH], radii[NVSWITCH] = 0.0, 0.0
    return Layout(size, Point(size / 2, size / 2), angles, radii, arcs, parent, sys_radius)


# ----------------------------------------------------------------------------- SVG


def _gib(mib: int) -> str:
    return f"{mib / 1024:.1f}"


def _gpu_label(holders: Sequence[Holding]) -> str:
    if not holders:
        return ""
    first = holders[0].name
    if len(first) > 16:
        first = first[:15] + "…"
    return first + (f" +{len(holders) - 1}" if len(holders) > 1 else "")


def _gpu_svg(state: NodeState, index: int, at: Point, held: Sequence[Holding]) -> str:
    gpu = state.topology.gpus[index]
    usage = state.usage[index]
    status = gpu_status(usage)
    x, y = at.x - _GPU_W / 2, at.y - _GPU_H / 2
    total = gpu.memory_mib
    used = total if usage.whole else min(usage.memory_used_mib, total)
    free = state.free_memory_mib(index) if usage.usable else 0
    bar = (_GPU_W - 12) * (used / total if total else (1.0 if usage.whole else 0.0))
    tip = [
        f"GPU {index} ({status})",
        gpu.uuid,
        gpu.model,
        f"memory: {_gib(free)} GiB free of {_gib(total)} GiB",
        f"share units: {state.free_units(index) if usage.usable else 0} free of {state.units_per_gpu}",
        f"NUMA node: {gpu.numa_node if gpu.numa_node is not None else 'unknown'}",
    ]
    tip += [f"{h.pod}: {_grant_text(h)}" for h in held]
    return (
        f'<g class="gpu" data-gpu="{index}" data-status="{status}">'
        f"<title>{escape(chr(10).join(tip))}</title>"
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{_GPU_W}" height="{_GPU_H}" rx="8" '
        f'fill="{STATUS_COLOURS[status]}" stroke="#263238" stroke-width="1.5"/>'
        f'<text x="{at.x:.1f}" y="{y + 17:.1f}" class="gpu-name">GPU {index}</text>'
        f'<text x="{at.x:.1f}" y="{y + 32:.1f}" class="small">{_gib(free)}/{_gib(total)} GiB free</text>'
        f'<text x="{at.x:.1f}" y="{y + 45:.1f}" class="small">{escape(_gpu_label(held)) or status}</text>'
        f'<rect x="{x + 6:.1f}" y="{y + _GPU_H - 12:.1f}" width="{_GPU_W - 12:.1f}" height="6" rx="3" '
        f'fill="#ffffff" stroke="#607d8b" stroke-width="0.5"/>'
        f'<rect x="{x + 6:.1f}" y="{y + _GPU_H - 12:.1f}" width="{bar:.1f}" height="6" rx="3" fill="#37474f"/>'
        "</g>"
    )


def _grant_text(h: Holding) -> str:
    g = h.grant
    if g.whole:
        return "whole GPU"
    if g.mig_uuid:
        return f"MIG {g.mig_uuid}"
    return f"{g.memory_mib} MiB, {g.units} units"


def _box(
    at: Point, w: float, h: float, label: str, fill: str, stroke: str, cls: str, tip: str, dashed: bool
) -> str:
    dash = ' stroke-dasharray="4 3"' if dashed else ""
    return (
        f'<g class="{cls}"><title>{escape(tip)}</title>'
        f'<rect x="{at.x - w / 2:.1f}" y="{at.y - h / 2:.1f}" width="{w}" height="{h}" rx="{h / 2 if cls == "nic" else 5}" '
        f'fill="{fill}" stroke="{stroke}" stroke-width="1.4"{dash}/>'
        f'<text x="{at.x:.1f}" y="{at.y + 4:.1f}" class="small">{escape(label)}</text></g>'
    )


def _vertex_svg(graph: nx.Graph, vertex: str, at: Point) -> str:
    data = graph.nodes[vertex]
    kind = data["type"]
    inferred = bool(data.get("inferred"))
    note = " (inferred from the PCIe levels)" if inferred else ""
    if kind == "nic":
        return _box(
            at, _NIC_W, _NIC_H, str(data["name"]), "#eceff1", "#455a64", "nic", f"NIC {data['name']}", False
        )
    if kind == "nvswitch":
        return _box(
            at,
            112,
            40,
            "NVSwitch",
            "#dcedc8",
            KIND_COLOURS[LinkKind.NV],
            "nvswitch",
            "NVSwitch fabric",
            False,
        )
    if kind in ("pcie_switch", "pcie_bridge", "host_bridge"):
        level = {"pcie_switch": LinkKind.PIX, "pcie_bridge": LinkKind.PXB, "host_bridge": LinkKind.PHB}[kind]
        short = {"pcie_switch": "PCIe sw", "pcie_bridge": "PCIe br", "host_bridge": "host br"}[kind]
        number = vertex[len(vertex.rstrip("0123456789")) :]
        return _box(
            at, 64, 18, f"{short} {number}", "#ffffff", KIND_COLOURS[level], "pcie", vertex + note, inferred
        )
    if kind == "numa":
        label = (
            "NUMA " + vertex[4:]
            if vertex.startswith("numa") and not vertex.startswith("numa-group")
            else vertex
        )
        return _box(at, 76, 24, label, "#f3e5f5", "#6a1b9a", "numa", f"{vertex}{note}", inferred)
    return _box(at, 76, 24, "host", "#f5f5f5", "#424242", "numa", "devices whose NUMA node is unknown", False)


def _link_label(kind: LinkKind, nvlinks: int) -> str:
    return f"NV{nvlinks}" if kind is LinkKind.NV else kind.value


def _edge_svg(a: Point, b: Point, kind: LinkKind, bandwidth: float, tip: str) -> str:
    dash = ' stroke-dasharray="6 4"' if kind is LinkKind.SYS else ""
    return (
        f'<line x1="{a.x:.1f}" y1="{a.y:.1f}" x2="{b.x:.1f}" y2="{b.y:.1f}" stroke="{KIND_COLOURS[kind]}" '
        f'stroke-width="{line_width(bandwidth)}" stroke-linecap="round"{dash}>'
        f"<title>{escape(f'{tip}, {bandwidth:g} GB/s')}</title></line>"
    )


def _arc_svg(
    layout: Layout, radius: float, span: tuple[float, float], kind: LinkKind, bandwidth: float, tip: str
) -> str:
    a0, a1 = span
    if a1 - a0 < 1e-6:
        return ""
    full = a1 - a0 >= 2 * math.pi - 1e-6
    if full:  # a closed ring: SVG arcs cannot start and end at one point
        c = layout.center
        shape = f'<circle cx="{c.x:.1f}" cy="{c.y:.1f}" r="{radius:.1f}" fill="none"'
    else:
        p0, p1 = layout.polar(radius, a0), layout.polar(radius, a1)
        large = 1 if a1 - a0 > math.pi else 0
        shape = f'<path d="M{p0.x:.1f},{p0.y:.1f} A{radius:.1f},{radius:.1f} 0 {large} 1 {p1.x:.1f},{p1.y:.1f}" fill="none"'
    dash = ' stroke-dasharray="6 4"' if kind is LinkKind.SYS else ""
    return (
        f'{shape} stroke="{KIND_COLOURS[kind]}" stroke-width="{line_width(bandwidth)}" stroke-linecap="round"{dash}>'
        f"<title>{escape(f'{tip}, {bandwidth:g} GB/s')}</title>" + ("</circle>" if full else "</path>")
    )


def _chord_svg(
    a: Point, b: Point, center: Point, kind: LinkKind, bandwidth: float, nvlinks: int, tip: str
) -> str:
    mid = Point((a.x + b.x) / 2, (a.y + b.y) / 2)
    ctrl = Point(center.x + (mid.x - center.x) * 0.35, center.y + (mid.y - center.y) * 0.35)
    label = _link_label(kind, nvlinks)
    lx, ly = 0.25 * a.x + 0.5 * ctrl.x + 0.25 * b.x, 0.25 * a.y + 0.5 * ctrl.y + 0.25 * b.y
    # chords through the middle cross there: their labels would pile up, the tooltip tells instead
    central = math.dist((lx, ly), (center.x, center.y)) < 0.2 * math.dist((a.x, a.y), (center.x, center.y))
    text = "" if central else f'<text x="{lx:.1f}" y="{ly + 4:.1f}" class="link-label">{label}</text>'
    return (
        f'<path d="M{a.x:.1f},{a.y:.1f} Q{ctrl.x:.1f},{ctrl.y:.1f} {b.x:.1f},{b.y:.1f}" fill="none" '
        f'stroke="{KIND_COLOURS[kind]}" stroke-width="{line_width(bandwidth)}" stroke-opacity="0.85">'
        f"<title>{escape(f'{tip}: {label}, {bandwidth:g} GB/s')}</title></path>{text}"
    )


def node_svg(snap: NodeSnapshot) -> str:
    """The node's graph as one <svg> element."""
    state = snap.state
    if state is None:
        return ""
    topology = state.topology
    graph = build_graph(topology)
    layout = radial_layout(topology, graph)
    c = layout.center
    parts: list[str] = []
    # buses: every switch, bridge and NUMA node spans its children; children join it radially
    for vertex, (a0, a1) in sorted(layout.arcs.items()):
        kids = [k for k, p in layout.parent.items() if p == vertex]
        if not kids:
            continue
        d = graph.edges[kids[0], vertex]
        parts.append(
            _arc_svg(layout, layout.radii[vertex], (a0, a1), d["kind"], float(d["bandwidth"]), vertex)
        )
    for child, up in sorted(layout.parent.items()):
        if child not in layout.angles or up not in layout.radii:
            continue
        d = graph.edges[child, up]
        joint = layout.polar(layout.radii[up], layout.angles[child])
        kind: LinkKind = d["kind"]
        tip = f"{child} - {up}: {_link_label(kind, int(d['nvlinks']))}"
        parts.append(_edge_svg(layout.at(child), joint, kind, float(d["bandwidth"]), tip))
    if layout.sys_radius:
        sys_bw = max(
            (
                float(d["bandwidth"])
                for _, _, d in graph.edges(data=True)
                if d["kind"] is LinkKind.SYS and d["role"] == "fabric"
            ),
            default=0.0,
        )
        tip = "SYS: NUMA nodes joined by the socket interconnect"
        parts.append(_arc_svg(layout, layout.sys_radius, (0.0, 2 * math.pi), LinkKind.SYS, sys_bw, tip))
        for root in sorted(v for v, d in graph.nodes(data=True) if d["type"] in ("numa", "host")):
            if root in layout.angles:
                joint = layout.polar(layout.sys_radius, layout.angles[root])
                parts.append(
                    _edge_svg(layout.at(root), joint, LinkKind.SYS, sys_bw, f"{root} - other NUMA nodes: SYS")
                )
    for u, v, d in sorted(graph.edges(data=True), key=lambda e: (str(e[0]), str(e[1]))):
        a, b = str(u), str(v)
        kind = d["kind"]
        bandwidth, nvlinks = float(d["bandwidth"]), int(d["nvlinks"])
        if NVSWITCH in (a, b):
            parts.append(_edge_svg(layout.at(a), layout.at(b), kind, bandwidth, f"{a} - {b}: NV{nvlinks}"))
        elif (
            d["role"] == "direct"
            and graph.nodes[a]["type"] == graph.nodes[b]["type"] == "gpu"
            and kind in (LinkKind.NV, LinkKind.INTERNAL)
            and not (kind is LinkKind.NV and topology.nvswitch)
        ):
            parts.append(_chord_svg(layout.at(a), layout.at(b), c, kind, bandwidth, nvlinks, f"{a} - {b}"))
    if topology.nvswitch and graph.has_edge("gpu0", NVSWITCH):
        first = graph.edges["gpu0", NVSWITCH]
        parts.append(
            f'<text x="{c.x:.1f}" y="{c.y + 36:.1f}" class="link-label">NV{first["nvlinks"]} per GPU, '
            f"{float(first['bandwidth']):g} GB/s</text>"
        )
    held = holdings(snap.ledger)
    for vertex in sorted(graph.nodes, key=str):
        name = str(vertex)
        if name not in layout.angles:
            continue
        if graph.nodes[name]["type"] == "gpu":
            index = int(graph.nodes[name]["index"])
            parts.append(_gpu_svg(state, index, layout.at(name), held.get(index, ())))
        else:
            parts.append(_vertex_svg(graph, name, layout.at(name)))
    size = layout.size
    shown = min(size, _MAX_SHOWN)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="topology" width="{shown:.0f}" height="{shown:.0f}" '
        f'viewBox="0 0 {size:.0f} {size:.0f}" role="img" aria-label="GPU topology of {escape(snap.name)}">'
        + "".join(parts)
        + "</svg>"
    )


# ----------------------------------------------------------------------------- HTML

_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,'DejaVu Sans',sans-serif;margin:18px;color:#1d2327;background:#fafafa}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:22px 0 8px}
.sub{color:#546e7a;font-size:13px;margin-bottom:12px}
.row{display:flex;gap:24px;align-items:flex-start;flex-wrap:wrap}
.card{background:#fff;border:1px solid #dde3e7;border-radius:8px;padding:10px 14px}
svg.topology{background:#fff;border:1px solid #dde3e7;border-radius:8px;max-width:100%;height:auto}
svg text{font-family:inherit;text-anchor:middle;fill:#1d2327}
.gpu-name{font-size:13px;font-weight:600}.small{font-size:10.5px}
.link-label{font-size:10px;font-weight:600;paint-order:stroke;stroke:#fff;stroke-width:3px;fill:#1d2327}
table{border-collapse:collapse;font-size:12.5px;background:#fff}
th,td{border:1px solid #dde3e7;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#eef2f4}td.num{text-align:right}
.legend{list-style:none;margin:0;padding:0;font-size:12.5px}.legend li{margin:4px 0;display:flex;gap:8px;align-items:center}
.sw{display:inline-block;width:22px;height:14px;border:1px solid #455a64;border-radius:3px;flex:none}
.ln{display:inline-block;width:28px;height:0;border-top-style:solid;flex:none}
.legend-card{max-width:380px}
.warn{color:#b71c1c}.muted{color:#78909c}
a{color:#1565c0}
"""


def _page(title: str, body: str) -> str:
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>{body}</body></html>"
    )


def legend_html() -> str:
    gpus = "".join(
        f'<li><span class="sw" style="background:{STATUS_COLOURS[s]}"></span><b>{s}</b> '
        f'<span class="muted">{escape(STATUS_MEANING[s])}</span></li>'
        for s in GPU_STATUSES
    )
    links = "".join(
        f'<li><span class="ln" style="border-top-color:{KIND_COLOURS[k]};border-top-width:3px;'
        f'border-top-style:{"dashed" if k is LinkKind.SYS else "solid"}"></span><b>{k.value}</b> '
        f'<span class="muted">{escape(KIND_MEANING[k])}</span></li>'
        for k in LinkKind
    )
    return (
        '<div class="card legend-card"><b>GPUs</b><ul class="legend">' + gpus + "</ul>"
        '<b>Links</b><ul class="legend">' + links + "</ul>"
        '<div class="muted" style="font-size:12px;max-width:320px">Line width grows with bandwidth '
        "(GB/s per direction). Dashed boxes are PCIe switches and bridges inferred from the "
        "link levels. Hover for details.</div></div>"
    )


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], numeric: Iterable[int] = ()) -> str:
    nums = set(numeric)
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(f"<td{' class=num' if i in nums else ''}>{cell}</td>" for i, cell in enumerate(r))
        + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _matrix_html(state: NodeState) -> str:
    graph = build_graph(state.topology)
    gpus = [g.index for g in state.topology.gpus]
    nics = [n.index for n in state.topology.nics]
    headers = ["", *(f"GPU{i}" for i in gpus), *(f"NIC{k}" for k in nics)]
    rows = []
    for i in gpus:
        cells = [f"<b>GPU{i}</b>"]
        for j in gpus:
            cells.append("X" if i == j else _cell(graph, f"gpu{i}", f"gpu{j}"))
        cells.extend(_cell(graph, f"gpu{i}", f"nic{k}") for k in nics)
        rows.append(cells)
    nic_names = ", ".join(f"NIC{n.index}: {escape(n.name)}" for n in state.topology.nics)
    return _table(headers, rows) + (
        f'<div class="muted" style="font-size:12px">{nic_names}</div>' if nic_names else ""
    )


def _cell(graph: nx.Graph, a: str, b: str) -> str:
    if not graph.has_edge(a, b):
        return '<span class="muted">?</span>'
    d = graph.edges[a, b]
    kind: LinkKind = d["kind"]
    label = f"NV{d['nvlinks']}" if kind is LinkKind.NV else kind.value
    return (
        f'<span style="color:{KIND_COLOURS[kind]};font-weight:600">{label}</span> {float(d["bandwidth"]):g}'
    )


def node_page(snap: NodeSnapshot) -> str:
    """GET /debug/topology/{node} as HTML."""
    summary = node_summary(snap)
    state = snap.state
    title = f"Linkpack: {snap.name}"
    back = '<a href="/debug/topology?format=html">all nodes</a>'
    if state is None:
        return _page(
            title,
            f"<h1>{escape(snap.name)}</h1><p class=sub>{back}</p><p class=warn>{escape(NO_TOPOLOGY_MESSAGE)}</p>",
        )
    counts = ", ".join(f"{summary[s]} {s}" for s in GPU_STATUSES if summary[s])
    head = (
        f"<h1>{escape(snap.name)}</h1><div class=sub>{back} · {state.topology.gpu_count} x {escape(model_of(state))}"
        f"{' · NVSwitch' if state.topology.nvswitch else ''} · {counts} · "
        f"{_gib(summary['freeMemoryMiB'])} GiB free · fragmentation {summary['fragmentationMilliGpu']:g} milli-GPU"
        f"{' · <b class=warn>node unschedulable</b>' if summary['unschedulable'] else ''}</div>"
    )
    problems = "".join(f"<p class=warn>GPU {p.gpu}: {escape(p.detail)}</p>" for p in snap.problems)
    warnings = "".join(f"<li>{escape(w)}</li>" for w in state.topology.warnings)
    held = holdings(snap.ledger)
    gpu_rows = []
    for i, gpu in enumerate(state.topology.gpus):
        u = state.usage[i]
        status = gpu_status(u)
        gpu_rows.append(
            [
                f"GPU {i}",
                f'<span class="sw" style="background:{STATUS_COLOURS[status]}"></span> {status}',
                escape(gpu.uuid),
                str(gpu.numa_node if gpu.numa_node is not None else "?"),
                f"{state.free_memory_mib(i) if u.usable else 0} / {gpu.memory_mib}",
                f"{state.free_units(i) if u.usable else 0} / {state.units_per_gpu}",
                "<br>".join(f"{escape(h.pod)}: {escape(_grant_text(h))}" for h in held.get(i, ())),
            ]
        )
    pod_rows = [
        [
            escape(f"{e.namespace}/{e.name}"),
            ", ".join(str(i) for i in e.allocation.gpu_indices),
            escape(e.allocation.enforcement.value),
            escape(", ".join(f"{k}={v}" for k, v in e.allocation.resources)),
        ]
        for e in snap.ledger.entries
    ]
    body = (
        head
        + problems
        + f'<div class="row"><div>{node_svg(snap)}</div>{legend_html()}</div>'
        + "<h2>GPUs</h2>"
        + _table(["GPU", "status", "UUID", "NUMA", "free MiB", "free units", "held by"], gpu_rows, (4, 5))
        + "<h2>Pods holding GPUs (ledger)</h2>"
        + (
            _table(["pod", "GPUs", "enforcement", "resources"], pod_rows)
            if pod_rows
            else "<p class=muted>none</p>"
        )
        + "<h2>Link matrix (kind, GB/s per direction)</h2>"
        + _matrix_html(state)
        + (f"<h2>Discovery warnings</h2><ul>{warnings}</ul>" if warnings else "")
    )
    return _page(title, body)


def _squares(state: NodeState | None) -> str:
    if state is None:
        return ""
    cells = "".join(
        f'<rect x="{i * 14}" y="0" width="12" height="12" rx="2" fill="{STATUS_COLOURS[gpu_status(u)]}" '
        'stroke="#455a64" stroke-width="0.6"/>'
        for i, u in enumerate(state.usage)
    )
    return f'<svg width="{max(14 * len(state.usage), 1)}" height="12">{cells}</svg>'


def index_page(snaps: Sequence[NodeSnapshot]) -> str:
    """GET /debug/topology as HTML: one row per node, GPUs as coloured squares."""
    rows = []
    for snap in snaps:
        s = node_summary(snap)
        link = f'<a href="/debug/topology/{escape(snap.name)}?format=html">{escape(snap.name)}</a>'
        if not s["hasTopology"]:
            rows.append([link, '<span class="warn">no topology record</span>', "", "", "", "", "", "", ""])
            continue
        rows.append(
            [
                link,
                escape(str(s["model"])),
                _squares(snap.state),
                str(s["gpus"]),
                *(str(s[k]) for k in ("free", "shared", "whole")),
                str(s["unhealthy"] + s["cordoned"]),
                f"{_gib(s['freeMemoryMiB'])} GiB · frag {s['fragmentationMilliGpu']:g}",
            ]
        )
    table = _table(
        ["node", "model", "GPUs", "count", "free", "shared", "whole", "unhealthy/cordoned", "free memory"],
        rows,
        (3, 4, 5, 6, 7),
    )
    body = (
        f"<h1>Linkpack GPU nodes</h1><div class=sub>{len(snaps)} nodes known to the extender</div>"
        f'<div class="row"><div>{table}</div>{legend_html()}</div>'
    )
    return _page("Linkpack: GPU nodes", body)
