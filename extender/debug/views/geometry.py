"""Where each vertex of a node's graph goes in the debug page's drawing: the radial layout.

`radial_layout` is a radial tree. GPUs and NICs sit on one ring in the order of the PCIe tree
(NUMA node, host bridge, bridge, switch), so devices under one switch are neighbours; every
inferred switch, bridge and NUMA node sits on an outer ring at the middle of the devices
beneath it; NVSwitch is the centre. NVLink pairs of boards without NVSwitch are drawn as chords
across the ring (`extender.debug.views.svg`). Line width grows with bandwidth (`line_width`).

Pure and deterministic: positions depend only on the `NodeTopology` (and its graph from
`topology.graph`), never on dict or set iteration order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import networkx as nx

from topology.graph import NVSWITCH, build_graph, fabric_view
from topology.model import NodeTopology

# height of each vertex type in the PCIe/NUMA tree: devices are leaves, NUMA nodes roots
_LEVEL = {"gpu": 0, "nic": 0, "pcie_switch": 1, "pcie_bridge": 2, "host_bridge": 3, "numa": 4, "host": 4}
_ARC_PER_WEIGHT = 132.0  # px of device ring per GPU
_NIC_WEIGHT = 0.5
_GROUP_GAP = 0.3  # extra weight between NUMA groups
_RING_STEP = 72.0
_MARGIN = 64.0


@dataclass(frozen=True, slots=True)
class Point:
    """A position in the drawing, in SVG user units (y grows downwards)."""

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
