"""The core types build and agree with each other."""

from topology.model import Gpu, GpuLink, LinkKind, NodeTopology
from topology.scheduling import NodeState


def test_an_empty_two_gpu_node_has_both_gpus_free() -> None:
    topo = NodeTopology(gpus=(Gpu(0), Gpu(1)), gpu_links=(GpuLink(0, 1, LinkKind.NV, 4),))
    assert NodeState.empty("n1", topo).whole_free() == (0, 1)
