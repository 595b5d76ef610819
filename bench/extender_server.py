"""`python -m bench.extender_server --nodes N --port P`: the extender over an in-memory fleet.

The fleet is N nodes of 8 GPUs (a mix of NVSwitch, hybrid-mesh, bridged-pair and two-socket
PCIe machines) carrying a mixed load, so that filter and prioritize do real work per node.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import replace

import uvicorn

from contract.allocation import Allocation
from contract.gpu_topology import as_published
from contract.ledger import Ledger, LedgerEntry
from extender.__main__ import handlers_for
from extender.app import create_app
from extender.config import ExtenderConfig
from extender.in_memory_cluster import InMemoryCluster
from extender.service import ExtenderService
from extender.snapshot import NodeFacts
from topology.catalog import load_machine
from topology.model import NodeTopology
from topology.placement import place
from topology.scheduling import GpuShare, NodeState, Placement, WholeGpus

MACHINES = ("hgx-h100", "dgx-a100", "dgx1-v100", "pcie-nv12-pairs", "rtx3090-2socket")


def _with_ids(topology: NodeTopology, node: str) -> NodeTopology:
    return replace(topology, gpus=tuple(replace(g, uuid=f"GPU-{node}-{g.index}") for g in topology.gpus))


def build_fleet(nodes: int, seed: int = 1) -> tuple[ExtenderConfig, InMemoryCluster]:
    config = ExtenderConfig()
    cluster = InMemoryCluster(config)
    rng = random.Random(seed)
    bases = {m: load_machine(m) for m in MACHINES}
    for i in range(nodes):
        name = f"gpu-{i:05d}"
        topology = _with_ids(bases[MACHINES[i % len(MACHINES)]], name)
        state = NodeState.empty(name, topology, config.units_per_gpu)
        entries = []
        for k in range(rng.randint(0, 5)):  # mixed load: some whole GPUs, some shares
            request = (
                WholeGpus(rng.choice((1, 1, 2)))
                if rng.random() < 0.6
                else GpuShare(units=25, memory_mib=8192)
            )
            outcome = place(state, request)
            if not isinstance(outcome, Placement):
                break
            from topology.accounting import with_grants

            state = with_grants(state, outcome.grants)
            entries.append(
                LedgerEntry(f"{name}-load-{k}", "load", f"{name}-{k}", Allocation(name, outcome.grants), 0.0)
            )
        cluster.add_node(NodeFacts(name), as_published(name, topology))
        if entries:
            cluster.write_ledger(Ledger(name, tuple(entries)))
    return config, cluster


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    config, cluster = build_fleet(args.nodes)
    service = ExtenderService(config, cluster)
    cluster.run_watches(handlers_for(service), lambda: True)
    uvicorn.run(create_app(service), host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
