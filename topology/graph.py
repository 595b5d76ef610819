"""A `networkx.Graph` view of one node's topology, for path and bandwidth queries.

Vertices (attribute `type`):
* `gpu<i>` ("gpu", with `index`, `model`) and `nic<k>` ("nic", with `index`, `name`): from the data.
* `nvswitch` ("nvswitch"): only when `NodeTopology.nvswitch`; every GPU hangs off it with its
  uniform NVLink count.
* `pcie-switch<k>` ("pcie_switch"), `pcie-bridge<k>` ("pcie_bridge"), `host-bridge<k>`
  ("host_bridge"): INFERRED. Devices (GPUs and NICs) whose pairwise PCIe level is PIX or closer
  are grouped under one switch; groups joined at PXB under one bridge; groups joined at PHB under
  one host bridge (connected components, level by level). NVLink pairs say nothing about PCIe and
  are left out, so on an all-NVLink board only the GPU↔NIC cells shape the tree.
* `numa<n>` ("numa"): the NUMA nodes named by the GPUs' `numa_node`. A unit (device or inferred
  bridge) hangs off the NUMA node of its GPUs, or, for NIC-only units, the NUMA node of the GPUs
  it reaches at NODE level or closer. When no GPU names a NUMA node, NODE-level components stand
  in as `numa-group<k>`. Units that cannot be placed hang off a `host` vertex.

Edges carry `kind` (LinkKind), `bandwidth` (GB/s per direction, topology.bandwidth), `nvlinks`
and `role`: "fabric" for the physical (inferred) structure above, "direct" for the pairwise
summary taken straight from the matrix (every GPU pair, and every GPU↔NIC pair), so callers can
read pair bandwidth off the graph. Use `fabric_view` for path questions.
Unit→NUMA edges are kind NODE; NUMA↔NUMA (and host) edges are kind SYS.
"""

from __future__ import annotations

from collections.abc import Iterable

import networkx as nx

from topology.bandwidth import link_bandwidth
from topology.model import LinkKind, NodeTopology

_LEVELS = (
    (LinkKind.PIX, "pcie-switch", "pcie_switch"),
    (LinkKind.PXB, "pcie-bridge", "pcie_bridge"),
    (LinkKind.PHB, "host-bridge", "host_bridge"),
)
HOST = "host"
NVSWITCH = "nvswitch"


def gpu_vertex(index: int) -> str:
    return f"gpu{index}"


def nic_vertex(index: int) -> str:
    return f"nic{index}"


def build_graph(topology: NodeTopology) -> nx.Graph:
    """The graph described in the module docstring."""
    graph = nx.Graph(nvswitch=topology.nvswitch)
    model = topology.gpus[0].model if topology.gpus else ""
    models = {gpu.index: gpu.model for gpu in topology.gpus}
    for gpu in topology.gpus:
        graph.add_node(gpu_vertex(gpu.index), type="gpu", index=gpu.index, model=gpu.model)
    for nic in topology.nics:
        graph.add_node(nic_vertex(nic.index), type="nic", index=nic.index, name=nic.name)
    for link in topology.gpu_links:
        bandwidth = min(
            link_bandwidth(link.kind, link.nvlinks, models.get(link.a, "")),
            link_bandwidth(link.kind, link.nvlinks, models.get(link.b, "")),
        )
        _edge(graph, gpu_vertex(link.a), gpu_vertex(link.b), link.kind, bandwidth, link.nvlinks, "direct")
    for nic_link in topology.nic_links:
        bandwidth = link_bandwidth(nic_link.kind, 0, models.get(nic_link.gpu, ""))
        _edge(
            graph, gpu_vertex(nic_link.gpu), nic_vertex(nic_link.nic), nic_link.kind, bandwidth, 0, "direct"
        )
    if topology.nvswitch:
        _add_nvswitch(graph, topology)
    top_units = _add_pcie_tree(graph, topology, model)
    _add_numa(graph, topology, top_units, model)
    return graph


def fabric_view(graph: nx.Graph) -> nx.Graph:
    """The physical (inferred) structure only, without the pairwise "direct" edges."""
    return nx.subgraph_view(graph, filter_edge=lambda u, v: graph.edges[u, v]["role"] == "fabric")


def pair_bandwidth(graph: nx.Graph, a: int, b: int) -> float:
    """GB/s per direction between GPUs `a` and `b`, read off their direct edge."""
    return float(graph.edges[gpu_vertex(a), gpu_vertex(b)]["bandwidth"])


def _edge(graph: nx.Graph, u: str, v: str, kind: LinkKind, bandwidth: float, nvlinks: int, role: str) -> None:
    graph.add_edge(u, v, kind=kind, bandwidth=bandwidth, nvlinks=nvlinks, role=role)


def _add_nvswitch(graph: nx.Graph, topology: NodeTopology) -> None:
    graph.add_node(NVSWITCH, type="nvswitch")
    count = max((link.nvlinks for link in topology.gpu_links), default=0)
    for gpu in topology.gpus:
        bandwidth = link_bandwidth(LinkKind.NV, count, gpu.model)
        _edge(graph, gpu_vertex(gpu.index), NVSWITCH, LinkKind.NV, bandwidth, count, "fabric")


def _pcie_pairs(topology: NodeTopology) -> list[tuple[str, str, LinkKind]]:
    """Device pairs with a known PCIe level (NVLink pairs hide theirs)."""
    pairs: list[tuple[str, str, LinkKind]] = [
        (gpu_vertex(link.a), gpu_vertex(link.b), link.kind)
        for link in topology.gpu_links
        if link.kind is not LinkKind.NV
    ]
    pairs.extend(
        (gpu_vertex(nl.gpu), nic_vertex(nl.nic), nl.kind)
        for nl in topology.nic_links
        if nl.kind is not LinkKind.NV
    )
    return pairs


def _components(
    devices: Iterable[str], pairs: list[tuple[str, str, LinkKind]], level: LinkKind
) -> list[list[str]]:
    joined = nx.Graph()
    joined.add_nodes_from(devices)
    joined.add_edges_from((u, v) for u, v, kind in pairs if kind.pcie_rank >= level.pcie_rank)
    return sorted((sorted(c) for c in nx.connected_components(joined)), key=lambda c: c[0])


def _add_pcie_tree(graph: nx.Graph, topology: NodeTopology, model: str) -> dict[str, list[str]]:
    """Adds inferred switches/bridges; returns each top unit with the devices under it."""
    devices = sorted(
        [gpu_vertex(g.index) for g in topology.gpus] + [nic_vertex(n.index) for n in topology.nics]
    )
    pairs = _pcie_pairs(topology)
    unit_of = {device: device for device in devices}
    for level, prefix, vertex_type in _LEVELS:
        counter = 0
        for component in _components(devices, pairs, level):
            units = sorted({unit_of[device] for device in component})
            if len(units) < 2:
                continue
            vertex = f"{prefix}{counter}"
            counter += 1
            graph.add_node(vertex, type=vertex_type, inferred=True)
            for unit in units:
                _edge(graph, unit, vertex, level, link_bandwidth(level, 0, model), 0, "fabric")
            for device in component:
                unit_of[device] = vertex
    members: dict[str, list[str]] = {}
    for device in devices:
        members.setdefault(unit_of[device], []).append(device)
    return members


def _numa_labels(topology: NodeTopology) -> dict[str, str]:
    """A NUMA vertex name for each device whose NUMA node is known or can be inferred."""
    labels = {gpu_vertex(g.index): f"numa{g.numa_node}" for g in topology.gpus if g.numa_node is not None}
    devices = [gpu_vertex(g.index) for g in topology.gpus] + [nic_vertex(n.index) for n in topology.nics]
    components = _components(devices, _pcie_pairs(topology), LinkKind.NODE)
    has_numa = any(g.numa_node is not None for g in topology.gpus)
    for number, component in enumerate(components):
        known = {labels[d] for d in component if d in labels}
        if len(known) == 1:
            (label,) = known
            labels.update({d: label for d in component if d not in labels})
        elif not known and not has_numa and any(d.startswith("gpu") for d in component):
            labels.update({d: f"numa-group{number}" for d in component})
    return labels


def _add_numa(graph: nx.Graph, topology: NodeTopology, top_units: dict[str, list[str]], model: str) -> None:
    labels = _numa_labels(topology)
    node_bandwidth = link_bandwidth(LinkKind.NODE, 0, model)
    sys_bandwidth = link_bandwidth(LinkKind.SYS, 0, model)
    numa_vertices: set[str] = set()
    for unit, devices in sorted(top_units.items()):
        found = {labels[d] for d in devices if d in labels}
        target = found.pop() if len(found) == 1 else HOST
        if target not in graph:
            graph.add_node(
                target,
                type="host" if target == HOST else "numa",
                inferred=target != HOST and target.startswith("numa-group"),
            )
        numa_vertices.add(target)
        _edge(graph, unit, target, LinkKind.NODE, node_bandwidth, 0, "fabric")
    ordered = sorted(numa_vertices)
    for i, first in enumerate(ordered):
        for second in ordered[i + 1 :]:
            _edge(graph, first, second, LinkKind.SYS, sys_bandwidth, 0, "fabric")
