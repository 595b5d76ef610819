"""The embedded demo cluster: simulated GPU nodes whose node agents publish real topology records.

Each node is a captured machine (`topology.catalog`; the demo's captures ship in the package). Its
node agent runs discovery over a simulated NVML driven by that machine, and its record travels
through the same topology codec (JSON) the real agent publishes into the GpuTopology object.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from extender.config import ExtenderConfig
from extender.kube.in_memory import InMemoryCluster
from extender.kube.translate import read_gpu_topology
from extender.state.snapshot import NodeFacts
from node_agent.sources.discovery import discover
from node_agent.sources.nvml_simulated import SimulatedNvml, simulated_uuid
from topology.catalog import load_machine
from topology.codec import encode_topology

#: (node name, catalog machine) of the default embedded cluster.
DEFAULT_NODES: tuple[tuple[str, str], ...] = (
    ("hgx-h100-0", "hgx-h100"),
    ("dgx-a100-0", "dgx-a100"),
    ("dgx1-v100-0", "dgx1-v100"),
    ("pcie-pairs-0", "pcie-nv12-pairs"),
    ("rtx3090-0", "rtx3090-2socket"),
    ("rtx-a6000-0", "rtx-a6000-pairs"),
)


@dataclass(frozen=True, slots=True)
class DemoNode:
    name: str
    machine: str
    gpus: int
    model: str
    sources: tuple[tuple[str, str], ...]


def build_cluster(
    config: ExtenderConfig, nodes: tuple[tuple[str, str], ...] = DEFAULT_NODES
) -> tuple[InMemoryCluster, list[DemoNode]]:
    cluster = InMemoryCluster(config)
    described = []
    for node_name, machine in nodes:
        topology = load_machine(machine)
        per_node = replace(
            topology, gpus=tuple(replace(g, uuid=simulated_uuid(node_name, g.index)) for g in topology.gpus)
        )
        found = discover(SimulatedNvml(per_node, node_name=node_name), None)
        published = json.loads(json.dumps(encode_topology(found.topology)))  # what goes on the wire
        _, record, problem = read_gpu_topology({"metadata": {"name": node_name}, "spec": published})
        if record is None:
            raise ValueError(problem)
        cluster.add_node(NodeFacts(node_name), record)
        described.append(
            DemoNode(
                node_name,
                machine,
                record.topology.gpu_count,
                record.topology.gpus[0].model if record.topology.gpus else "",
                tuple(sorted(found.sources.items())),
            )
        )
    return cluster, described
