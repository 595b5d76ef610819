"""The networkx view: devices, inferred switches/bridges/NUMA nodes, and pair bandwidth on edges."""

from __future__ import annotations

import networkx as nx
import pytest

from tests.support import machines
from topology.bandwidth import link_bandwidth
from topology.catalog import load_machine, synthetic_dgx2
from topology.graph import build_graph, fabric_view, pair_bandwidth
from topology.model import LinkKind, NodeTopology


@pytest.fixture(scope="module")
def dgx_a100() -> NodeTopology:
    return machines.dgx_a100()


def vertices_of_type(graph: nx.Graph, kind: str) -> list[str]:
    return sorted(v for v, data in graph.nodes(data=True) if data["type"] == kind)


def test_dgx_a100_has_gpus_nics_nvswitch_and_its_four_numa_nodes(dgx_a100: NodeTopology) -> None:
    """DGX A100: 8 GPU and 10 NIC vertices, one NVSwitch, NUMA nodes 1/3/5/7 from the GPUs' affinity."""
    graph = build_graph(dgx_a100)
    assert vertices_of_type(graph, "gpu") == [f"gpu{i}" for i in range(8)]
    assert len(vertices_of_type(graph, "nic")) == 10
    assert vertices_of_type(graph, "nvswitch") == ["nvswitch"]
    assert vertices_of_type(graph, "numa") == ["numa1", "numa3", "numa5", "numa7"]


def test_dgx_a100_gpus_reach_the_nvswitch_with_twelve_links(dgx_a100: NodeTopology) -> None:
    """Each A100 hangs off the NVSwitch with 12 NVLinks, 300 GB/s per direction."""
    edge = build_graph(dgx_a100).edges["gpu3", "nvswitch"]
    assert (edge["kind"], edge["nvlinks"], edge["bandwidth"], edge["role"]) == (
        LinkKind.NV,
        12,
        300.0,
        "fabric",
    )


def test_dgx_a100_gpu_pairs_share_a_pcie_bridge_with_their_nics(dgx_a100: NodeTopology) -> None:
    """GPU0, GPU1, NIC0 and NIC1 (all PXB to each other) sit under one inferred PCIe bridge on NUMA 3."""
    fabric = fabric_view(build_graph(dgx_a100))
    bridge = next(v for v in fabric["gpu0"] if v.startswith("pcie-bridge"))
    assert sorted(v for v in fabric[bridge] if v.startswith(("gpu", "nic"))) == [
        "gpu0",
        "gpu1",
        "nic0",
        "nic1",
    ]
    assert "numa3" in fabric[bridge]


def test_direct_edges_carry_pair_bandwidth(dgx_a100: NodeTopology) -> None:
    """Every GPU pair has a direct edge whose bandwidth is topology.bandwidth's figure for the link."""
    graph = build_graph(dgx_a100)
    assert pair_bandwidth(graph, 0, 7) == link_bandwidth(LinkKind.NV, 12, "A100-SXM4-40GB")
    direct = [
        e
        for e in graph.edges(data=True)
        if e[2]["role"] == "direct" and e[0].startswith("gpu") and e[1].startswith("gpu")
    ]
    assert len(direct) == 28


def test_v100_pcie_pix_pairs_become_two_switches_under_one_host_bridge() -> None:
    """4x V100 PCIe: PIX pairs 0-1 and 2-3 give two PCIe switches joined by one host bridge on NUMA 0."""
    fabric = fabric_view(build_graph(load_machine("v100-pcie-pix-phb")))
    switches = vertices_of_type(fabric, "pcie_switch")
    assert len(switches) == 2
    assert {frozenset(v for v in fabric[s] if v.startswith("gpu")) for s in switches} == {
        frozenset({"gpu0", "gpu1"}),
        frozenset({"gpu2", "gpu3"}),
    }
    (host_bridge,) = vertices_of_type(fabric, "host_bridge")
    assert set(fabric[host_bridge]) == {*switches, "numa0"}
    assert fabric.edges[switches[0], host_bridge]["kind"] is LinkKind.PHB


def test_rtx3090_sockets_are_joined_by_a_sys_edge() -> None:
    """8x RTX 3090: GPUs 0-3 hang off numa0, 4-7 off numa1, and the NUMA nodes are linked at SYS."""
    fabric = fabric_view(build_graph(load_machine("rtx3090-2socket")))
    assert "numa0" in fabric["gpu2"] and "numa1" in fabric["gpu6"]
    assert fabric.edges["numa0", "numa1"]["kind"] is LinkKind.SYS
    assert nx.shortest_path(fabric, "gpu0", "gpu7") == ["gpu0", "numa0", "numa1", "gpu7"]


def test_cube_mesh_without_numa_column_infers_one_numa_group() -> None:
    """DGX-1V (no NUMA Affinity column, all non-NVLink pairs NODE): one inferred NUMA group, no NVSwitch."""
    graph = build_graph(load_machine("dgx1-v100"))
    assert vertices_of_type(graph, "nvswitch") == []
    (group,) = vertices_of_type(graph, "numa")
    assert graph.nodes[group]["inferred"] is True
    assert graph.edges["gpu0", "gpu1"]["nvlinks"] == 2


def test_dgx2_every_gpu_reaches_every_other_through_the_nvswitch() -> None:
    """Synthetic DGX-2: 16 GPUs, each one NVSwitch hop from the others with 6 links."""
    fabric = fabric_view(build_graph(synthetic_dgx2()))
    assert all(fabric.edges[f"gpu{i}", "nvswitch"]["nvlinks"] == 6 for i in range(16))
    assert nx.shortest_path_length(fabric, "gpu0", "gpu15") == 2


def test_single_gpu_workstation_graph_is_one_gpu_on_its_numa_node() -> None:
    """RTX PRO 6000 workstation: the GPU and its NUMA node, nothing else."""
    graph = build_graph(load_machine("rtx-pro-6000-1gpu"))
    assert sorted(graph.nodes) == ["gpu0", "numa0"]
