"""A node's graph drawn as one inline SVG element, for the debug page.

Vertices are placed by `extender.debug.views.geometry.radial_layout`: GPUs (coloured by use, with a
memory bar and their holders), NICs, PCIe switches and bridges, NUMA nodes and NVSwitch. Each
switch, bridge and NUMA node is a bus (an arc over its children); NUMA nodes are joined by the
dashed SYS ring; NVLink pairs without NVSwitch are chords. Colours are those of
`extender.debug.views.palette`; hovering any shape shows a tooltip (`<title>`) with the details.

Every text taken from the cluster (node, pod and device names) is escaped here, so the
results are returned as `markupsafe.Markup`, safe to place in a page as they are.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

import networkx as nx
from markupsafe import Markup

from extender.debug.views.geometry import Layout, Point, line_width, radial_layout
from extender.debug.views.occupants import Occupant, occupants_by_gpu
from extender.debug.views.palette import KIND_COLOURS, STATUS_COLOURS, gib, link_label
from extender.state.snapshot import TrackedNode
from topology.gpu_status import gpu_status
from topology.graph import NVSWITCH, build_graph
from topology.model import LinkKind
from topology.scheduling import NodeState

_GPU_W, _GPU_H = 100.0, 60.0
_NIC_W, _NIC_H = 58.0, 20.0
_MAX_SHOWN = 800.0  # px; larger drawings are scaled down to fit beside the legend


def _gpu_label(holders: Sequence[Occupant]) -> str:
    if not holders:
        return ""
    first = holders[0].name
    if len(first) > 16:
        first = first[:15] + "…"
    return first + (f" +{len(holders) - 1}" if len(holders) > 1 else "")


def _gpu_svg(state: NodeState, index: int, at: Point, held: Sequence[Occupant]) -> str:
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
        f"memory: {gib(free)} GiB free of {gib(total)} GiB",
        f"share units: {state.free_units(index) if usage.usable else 0} free of {state.units_per_gpu}",
        f"NUMA node: {gpu.numa_node if gpu.numa_node is not None else 'unknown'}",
    ]
    tip += [f"{h.pod}: {h.grant_text}" for h in held]
    return (
        f'<g class="gpu" data-gpu="{index}" data-status="{status}">'
        f"<title>{escape(chr(10).join(tip))}</title>"
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{_GPU_W}" height="{_GPU_H}" rx="8" '
        f'fill="{STATUS_COLOURS[status]}" stroke="#263238" stroke-width="1.5"/>'
        f'<text x="{at.x:.1f}" y="{y + 17:.1f}" class="gpu-name">GPU {index}</text>'
        f'<text x="{at.x:.1f}" y="{y + 32:.1f}" class="small">{gib(free)}/{gib(total)} GiB free</text>'
        f'<text x="{at.x:.1f}" y="{y + 45:.1f}" class="small">{escape(_gpu_label(held)) or status}</text>'
        f'<rect x="{x + 6:.1f}" y="{y + _GPU_H - 12:.1f}" width="{_GPU_W - 12:.1f}" height="6" rx="3" '
        f'fill="#ffffff" stroke="#607d8b" stroke-width="0.5"/>'
        f'<rect x="{x + 6:.1f}" y="{y + _GPU_H - 12:.1f}" width="{bar:.1f}" height="6" rx="3" fill="#37474f"/>'
        "</g>"
    )


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
    label = link_label(kind, nvlinks)
    lx, ly = 0.25 * a.x + 0.5 * ctrl.x + 0.25 * b.x, 0.25 * a.y + 0.5 * ctrl.y + 0.25 * b.y
    # chords through the middle cross there: their labels would pile up, the tooltip tells instead
    central = math.dist((lx, ly), (center.x, center.y)) < 0.2 * math.dist((a.x, a.y), (center.x, center.y))
    text = "" if central else f'<text x="{lx:.1f}" y="{ly + 4:.1f}" class="link-label">{label}</text>'
    return (
        f'<path d="M{a.x:.1f},{a.y:.1f} Q{ctrl.x:.1f},{ctrl.y:.1f} {b.x:.1f},{b.y:.1f}" fill="none" '
        f'stroke="{KIND_COLOURS[kind]}" stroke-width="{line_width(bandwidth)}" stroke-opacity="0.85">'
        f"<title>{escape(f'{tip}: {label}, {bandwidth:g} GB/s')}</title></path>{text}"
    )


def node_svg(snap: TrackedNode) -> Markup:
    """The node's graph as one <svg> element (empty for a node without topology)."""
    state = snap.state
    if state is None:
        return Markup("")
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
        tip = f"{child} - {up}: {link_label(kind, int(d['nvlinks']))}"
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
    held = occupants_by_gpu(snap.ledger)
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
    return Markup(
        f'<svg xmlns="http://www.w3.org/2000/svg" class="topology" width="{shown:.0f}" height="{shown:.0f}" '
        f'viewBox="0 0 {size:.0f} {size:.0f}" role="img" aria-label="GPU topology of {escape(snap.name)}">'
        + "".join(parts)
        + "</svg>"
    )


def gpu_squares(state: NodeState | None) -> Markup:
    """The node's GPUs as a row of small squares coloured by state (the overview's GPU column)."""
    if state is None:
        return Markup("")
    cells = "".join(
        f'<rect x="{i * 14}" y="0" width="12" height="12" rx="2" fill="{STATUS_COLOURS[gpu_status(u)]}" '
        'stroke="#455a64" stroke-width="0.6"/>'
        for i, u in enumerate(state.usage)
    )
    return Markup(f'<svg width="{max(14 * len(state.usage), 1)}" height="12">{cells}</svg>')
